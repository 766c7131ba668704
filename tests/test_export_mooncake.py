"""``schedtrace export --format mooncake``: one JSON line per request, read by sglang's own loader."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from otel_support import run_cli
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.prefix_ids import prefix_ids
from schedtrace.tracer.analysis.workload import Workload, WorkloadRequest
from schedtrace.tracer.contract.schema import Abort, Arrival, Clock, Finish
from schedtrace.tracer.export.mooncake import MOONCAKE_BLOCK_TOKENS, mooncake_lines
from schedtrace.tracer.sandbox.server import MODEL_DIR

KEY = b"k" * 32
BLOCK = 16
MS = 1_000_000
SYSTEM = list(range(100, 100 + 3 * BLOCK))  # three blocks every "family" request starts with


def arrival(t_ms: int, rid: str, tokens: list[int], max_new: int, **fields) -> Arrival:
    return Arrival(t_ns=t_ms * MS, rid=rid, input_len=len(tokens), max_new_tokens=max_new,
                   prefix_ids=prefix_ids(KEY, tokens, BLOCK), **fields)


def workload_trace(path: Path) -> Path:
    """Five requests: a family of three sharing SYSTEM, a loner, a client abort, one unfinished."""
    records = [
        arrival(1000, "a", SYSTEM + [7] * 5, 40, priority=2, ignore_eos=True),
        Clock(t_ns=1500 * MS, wall_ns=20_000 * MS),  # the wall clock stepped 8.5 s on: later records follow it
        arrival(1600, "b", SYSTEM + [8] * 20, 30, priority=0),
        arrival(1700, "loner", [9] * 40, 10),
        Finish(t_ns=1800 * MS, rid="a", output_len=40, reason="length"),
        arrival(2000, "c", SYSTEM, 50),
        Finish(t_ns=2100 * MS, rid="b", output_len=12, reason="stop"),
        Abort(t_ns=2400 * MS, rid="c"),
        Finish(t_ns=2401 * MS, rid="c", output_len=3, reason="abort"),
        Finish(t_ns=2500 * MS, rid="loner", output_len=10, reason="length"),
        arrival(2600, "open", [5] * 17, 64),
    ]
    return write_trace(path, builders.header(prefix_block=BLOCK, start_wall_ns=10_000 * MS), records,
                       end_t_ns=3000 * MS)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, list[dict]]:
    folder = tmp_path_factory.mktemp("mooncake")
    out = folder / "w.jsonl"
    done = run_cli("export", str(workload_trace(folder / "w.trace")), "--format", "mooncake", "-o", str(out),
                   "--block-size", str(BLOCK))
    assert done.returncode == 0, done.stderr
    assert "5 requests (1 aborted by the client)" in done.stderr
    return out, [json.loads(line) for line in out.read_text().splitlines()]


def test_rows_hold_lengths_produced_outputs_and_shared_block_numbers(exported) -> None:
    _, rows = exported
    a, b, loner, c, unfinished = rows
    # ms from the first arrival, on the wall clock: the Clock record stepped it 8.5 s on from 1.5 s
    assert [r["timestamp"] for r in rows] == [0, 8500 + 600, 8500 + 700, 8500 + 1000, 8500 + 1600]
    assert [r["input_length"] for r in rows] == [53, 68, 40, 48, 17]
    assert [r["output_length"] for r in rows] == [40, 12, 10, 3, 64]  # the finish's, else the ask
    # The family shares its first three blocks' numbers, numbered in first-seen order; nothing else is shared.
    assert a["hash_ids"] == [0, 1, 2, 3]
    assert b["hash_ids"][:3] == [0, 1, 2] and b["hash_ids"][3:] == [4, 5]
    assert loner["hash_ids"] == [6, 7, 8]
    assert c["hash_ids"] == [0, 1, 2]
    assert unfinished["hash_ids"] == [9, 10]
    assert [r["priority"] for r in rows] == [2, 0, None, None, None]
    assert [r["ignore_eos"] for r in rows] == [True, False, False, False, False]
    assert [r["max_new_tokens"] for r in rows] == [40, 30, 10, 50, 64]
    assert [r["aborted"] for r in rows] == [False, False, False, True, False]
    assert c["abort_ms"] == 400
    assert [r["finish_reason"] for r in rows] == ["length", "stop", "length", "abort", None]
    assert {r["block_size"] for r in rows} == {BLOCK}


def test_sglang_mooncake_loader_reads_the_file(exported) -> None:
    """bench_serving's own dataset loader and its request generator take the file as it is."""
    from transformers import AutoTokenizer

    from sglang.benchmark.datasets.mooncake import MooncakeDataset, get_mooncake_request_over_time

    path, rows = exported
    loaded = MooncakeDataset(dataset_path=str(path), mooncake_workload="mooncake", num_requests=100).load()
    assert loaded == rows
    tokenizer = AutoTokenizer.from_pretrained(str(MODEL_DIR))

    async def collect() -> list:
        return [row async for row in get_mooncake_request_over_time(loaded, tokenizer, 0.001, 1)]

    made = asyncio.run(collect())
    assert [m.output_len for m in made] == [r["output_length"] for r in rows]
    assert all(m.prompt_len > 0 for m in made)


def test_an_arrival_whose_ids_do_not_fit_its_length_is_one_line(tmp_path) -> None:
    bad = Arrival(t_ns=MS, rid="x", input_len=500, max_new_tokens=4, prefix_ids=b"\0" * 16)  # 2 ids, 32 expected
    trace = write_trace(tmp_path / "bad.trace", builders.header(prefix_block=BLOCK), [bad], end_t_ns=2 * MS)
    out = tmp_path / "bad.jsonl"
    done = run_cli("export", str(trace), "--format", "mooncake", "-o", str(out))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert str(trace) in lines[0] and "expected 32 ids" in lines[0]
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_coarser_blocks_keep_the_shared_prefix_and_renumber() -> None:
    """Two trace blocks per hash id: the chained id of each pair's last block, numbered anew."""
    def req(ids: list[int]) -> WorkloadRequest:
        return WorkloadRequest(t_ms=0.0, input_len=16 * len(ids), output_len=1, hash_ids=ids, max_new_tokens=1,
                               ignore_eos=False, priority=None, finish_reason="length")

    workload = Workload(block=16, shared_prefixes=True, requests=[req([0, 1, 2, 3, 4]), req([0, 1, 2, 5]), req([6])])
    rows = [json.loads(line) for line in mooncake_lines(workload, 32)]
    assert [r["hash_ids"] for r in rows] == [[0, 1, 2], [0, 3], [4]]
    assert {r["block_size"] for r in rows} == {32}
    assert json.loads(next(mooncake_lines(workload)))["block_size"] == MOONCAKE_BLOCK_TOKENS  # the default


def test_a_block_size_that_is_not_a_multiple_is_refused(tmp_path) -> None:
    trace = workload_trace(tmp_path / "w.trace")
    done = run_cli("export", str(trace), "--format", "mooncake", "-o", str(tmp_path / "w.jsonl"), "--block-size", "24")
    assert done.returncode == 2 and "multiple of the trace's 16-token block" in done.stderr
