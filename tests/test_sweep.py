"""The what-if sweep (schedtrace.replay.scale.sweep, schedtrace sweep): closed loops of each
arm over a grid of server arguments, with the real sglang code (PassDriver)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import run
from schedtrace.replay.loop.run import load_input, run_closed_loop
from schedtrace.replay.scale.executor import LocalExecutor
from schedtrace.replay.scale.sweep import run_sweep, sweep_arm
from schedtrace.replay.scale.sweep_grid import POLICIES, REFUSED_POLICIES, apply_config, grid_cells, parse_grid
from schedtrace.testing import builders
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.report import dump_sweep
from schedtrace.tracer.contract.schema import Arrival, Finish, KvSnapshot, RunningReq, WaitingReq

from loop_traces import MS
from test_cli import WIDTH, assert_one_error_line, probe

BASE = {"max_running_requests": 4, "chunked_prefill_size": 4096, "schedule_policy": "fcfs", "max_total_tokens": 20000}
# (input, output) of each request; one arrives every 2 ms, the clock has a pass every 1 ms.
REQUESTS = [(3000, 30), (1500, 60), (3000, 20), (800, 90), (2500, 40), (1200, 70), (3000, 50), (600, 30)]


def grid_trace(path: Path, **config) -> Path:
    """A server that ran with ``config`` (BASE otherwise), empty at pass 0, under a burst."""
    c = {**BASE, **config}
    args = builders.server_args(**c)
    head = builders.header(server_args=args, max_req_slots=c["max_running_requests"])
    rid = [f"r{k}" for k in range(len(REQUESTS))]
    first = WaitingReq(rid[0], REQUESTS[0][0], 0, REQUESTS[0][1] + 10, 0, None, False)
    start = builders.pass_record(0, waiting=[first], kv=KvSnapshot(available=c["max_total_tokens"], evictable=0),
                                 req_slots_free=c["max_running_requests"],
                                 chunked_prefill_size=c["chunked_prefill_size"])
    clock = [builders.pass_record(n) for n in range(1, 30)]  # the recorded pass clock: 1 ms a pass
    # max_new_tokens differ, so longest-output-first orders the queue its own way.
    arrivals = [Arrival(t_ns=2 * k * MS, rid=rid[k], input_len=n, max_new_tokens=out + 10)
                for k, (n, out) in enumerate(REQUESTS)]
    finishes = [Finish(t_ns=40 * MS, rid=rid[k], output_len=out, reason="length") for k, (_, out) in
                enumerate(REQUESTS)]
    return write_trace(path, head, [arrivals[0], start, *arrivals[1:], *clock, *finishes])


GRID = {"max_running_requests": [2, 4], "chunked_prefill_size": [1024, 4096], "max_total_tokens": [5000, 20000],
        "schedule_policy": ["fcfs", "lof"]}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return grid_trace(tmp_path_factory.mktemp("sweep") / "base.trace")


@pytest.fixture(scope="module")
def report(base):
    return run_sweep(base, GRID, ["stock", "fixed"])


def test_every_cell_is_the_closed_loop_of_a_server_run_with_that_config(report, tmp_path):
    assert [cell.config for cell in report.cells] == grid_cells(GRID)
    for n, cell in enumerate(report.cells):
        direct = run_closed_loop(grid_trace(tmp_path / f"cell{n}.trace", **cell.config), ["stock", "fixed"])
        assert cell.arms == {arm: sweep_arm(o) for arm, o in direct.arms.items()}, cell.config
    # The grid matters: slots, chunk, pool and policy each change some cell.
    for key in GRID:
        assert any(c.arms != _twin(report, c, key).arms for c in report.cells), f"{key} changes nothing"


def _twin(report, cell, key):
    """The cell with the other value of ``key``."""
    other = next(v for v in report.grid[key] if v != cell.config[key])
    return next(c for c in report.cells if c.config == {**cell.config, key: other})


def test_the_json_is_the_same_bytes_for_any_job_count(base, report):
    two = run_sweep(base, GRID, ["stock", "fixed"], executor=LocalExecutor(2))
    assert dump_sweep(two) == dump_sweep(report)
    assert dump_sweep(report) == dump_sweep(run_sweep(base, GRID, ["stock", "fixed"]))


def test_the_self_check_comes_with_the_sweep_whether_or_not_the_grid_has_the_recorded_config(base, report):
    reference = run_closed_loop(base, ["stock"]).self_check
    assert report.self_check == reference  # the grid holds (4, 4096, 20000, fcfs)
    elsewhere = run_sweep(base, {"max_running_requests": [2]}, ["fixed"])
    assert elsewhere.self_check == reference and len(elsewhere.cells) == 1
    assert report.recorded == BASE and report.keys == list(GRID)
    assert any("counted in scheduler passes" in note for note in report.notes)


# ----------------------------------------------------------- the grid, pure


def test_apply_config_moves_slots_and_pool_by_the_difference(base):
    with TraceReader(base) as reader:
        loop = load_input(reader, 0)
    cell = apply_config(loop, {"max_running_requests": 7, "max_total_tokens": 25000, "chunked_prefill_size": -1,
                               "schedule_policy": "lpm"})
    args = cell.header.server_args
    assert (args.max_running_requests, args.max_total_tokens, args.chunked_prefill_size) == (7, 25000, -1)
    assert args.schedule_policy == "lpm" and cell.header.max_req_slots == 7
    assert (cell.initial.req_slots_free, cell.initial.free) == (7, 25000)
    assert cell.start.chunked_prefill_size is None  # -1: chunking off, as sglang reads it
    assert loop.initial.free == 20000 and loop.header.server_args.max_running_requests == 4  # untouched


def test_a_config_the_start_cannot_have_is_a_usage_error(base, tmp_path):
    busy = write_trace(tmp_path / "busy.trace", builders.header(), [builders.pass_record(
        0, running=[RunningReq(f"r{k}", 1000, 5, 50) for k in range(3)], req_slots_free=9,
        kv=KvSnapshot(available=100, evictable=50))])
    with TraceReader(busy) as reader:
        loop = load_input(reader, 0)
    with pytest.raises(UsageError, match="max_running_requests=2: the start pass already runs 3 requests"):
        apply_config(loop, {"max_running_requests": 2})
    with pytest.raises(UsageError, match="max_total_tokens=39800: the start pass's requests already hold 39850"):
        apply_config(loop, {"max_total_tokens": 39800})
    smaller = apply_config(loop, {"max_total_tokens": 39880})  # the cache gives way first
    assert (smaller.initial.free, smaller.initial.evictable) == (0, 30)


def test_the_policies_are_sglangs():
    from sglang.srt.managers.schedule_policy import CacheAgnosticPolicy, CacheAwarePolicy

    assert {*POLICIES, *REFUSED_POLICIES} == {p.value for p in (*CacheAwarePolicy, *CacheAgnosticPolicy)}


@pytest.mark.parametrize("sets, message", [
    ([], "at least one --set"),
    (["max_running_requests"], "expected KEY=VALUE"),
    (["page_size=16"], "not a sweep key"),
    (["max_running_requests=8,x"], "'x' is not an integer"),
    (["max_running_requests=0"], "must be at least 1"),
    (["chunked_prefill_size=-2"], "(or -1: off)"),
    (["max_total_tokens=8,,9"], "an empty value"),
    (["max_total_tokens=8,8"], "a value given twice"),
    (["schedule_policy=random"], "a sweep must be deterministic"),
    (["schedule_policy=lifo"], "is not one of fcfs"),
    (["max_running_requests=8", "max_running_requests=9"], "given twice"),
])
def test_parse_grid_refuses(sets, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_grid(sets)


# ------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("args, expected", [
    (["--set", "max_foo=1"], ["--set 'max_foo'", "not a sweep key"]),
    (["--set", "max_running_requests=8,x"], ["'x' is not an integer"]),
    (["--set", "schedule_policy=random"], ["deterministic"]),
    ([], ["at least one --set"]),
    (["--set", "max_running_requests=8", "--arms", "stock,nope"], ["--arms nope", "valid names"]),
    (["--set", "max_running_requests=8", "--heatmap", "stalls", "--x", "max_total_tokens"], ["not a key of the grid"]),
    (["--set", "max_running_requests=8", "--x", "max_running_requests"], ["give --heatmap"]),
    (["--set", "max_running_requests=8", "--heatmap", "speed"], ["--heatmap", "'speed'"]),
])
def test_bad_input_is_one_line_exit_2_before_sglang(base, args, expected):
    done = probe("sweep", str(base), *args)
    assert_one_error_line(done, *expected)
    assert done.stdout.splitlines()[-1] == "sglang imported: False"


def test_the_command_prints_a_table_a_heatmap_and_what_a_what_if_can_tell(base, report, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    args = ["sweep", str(base), "--arms", "stock,fixed", "--json", str(out), "--heatmap", "wait_p90",
            "--x", "chunked_prefill_size", "--y", "max_running_requests", "--jobs", "1"]
    for key, values in GRID.items():
        args += ["--set", f"{key}={','.join(map(str, values))}"]
    assert run(args) == 0
    shown = capsys.readouterr().out
    assert out.read_bytes() == dump_sweep(report)
    lines = shown.splitlines()
    assert max(map(len, lines)) <= WIDTH
    # The last two keys are columns; one table per value of the others.
    assert "max_running_requests=2, chunked_prefill_size=1024" in shown
    assert sum("wait_p90, stock" in line for line in lines) == 4  # a heatmap per arm and other values
    assert "time is counted in scheduler passes" in shown.lower()
    assert "self-check (stock, recorded config): wait error p50" in shown
    first = report.cells[0].arms["stock"]
    assert any(line.split()[:3] == ["5000", "fcfs", "stock"] and str(first.wait_p90) in line.split()
               for line in lines)


def test_json_to_stdout_replaces_the_summary(base, capsys):
    assert run(["sweep", str(base), "--set", "max_running_requests=2,4", "--json", "-", "--jobs", "1"]) == 0
    decoded = msgspec.json.decode(capsys.readouterr().out)
    assert [c["config"] for c in decoded["cells"]] == [{"max_running_requests": 2}, {"max_running_requests": 4}]
