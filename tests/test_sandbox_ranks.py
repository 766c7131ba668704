"""Two scheduler ranks on CPU: ``SandboxServer(tp=2)`` serves and records both ranks.

The tiny Llama at ``--tp 2`` with its real forward (a real gloo all-reduce
between the ranks; pynccl is stood in for): one scheduler process per rank,
each writing its own trace. Requests complete, the two traces carry tp_rank
0 and 1, and both ranks made the same scheduling decisions.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import generate

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Finish, Header, Pass
from schedtrace.tracer.sandbox.server import SandboxServer

pytestmark = [pytest.mark.own_server, pytest.mark.timeout(900)]

LENGTHS = [1800, 300, 600, 900, 1200, 450]  # one longer than a chunk; more than the running slots
MAX_NEW_TOKENS = 12
RANK_ARGS = ("--chunked-prefill-size", "1024", "--max-running-requests", "4", "--max-total-tokens", "16384")
FINISH_WAIT_S = 30.0


def read_rank(path: Path) -> tuple[Header, list]:
    with TraceReader(path) as reader:
        return reader.header, [r for _, r in reader.records()]


def decisions(records: list, rids: set[str]) -> list[tuple[str, ...]]:
    """Each admitting pass's admitted rids, in order (ours only)."""
    return [
        tuple(a.rid for a in r.admitted)
        for r in records
        if isinstance(r, Pass) and any(a.rid in rids for a in r.admitted)
    ]


def test_tp2_serves_and_writes_one_trace_per_rank(tmp_path: Path) -> None:
    server = SandboxServer(tp=2, trace_dir=tmp_path / "traces", log_path=tmp_path / "server.log",
                           extra_args=RANK_ARGS)
    rids = {f"ranks-{i}" for i in range(len(LENGTHS))}
    with server:
        assert server.stand_ins == ("no-pynccl",)  # the real forward, across two ranks
        with ThreadPoolExecutor(len(LENGTHS)) as pool:
            replies = list(pool.map(lambda i: generate(server, f"ranks-{i}", LENGTHS[i], MAX_NEW_TOKENS),
                                    range(len(LENGTHS))))
        for i, reply in enumerate(replies):
            assert reply["meta_info"]["id"] == f"ranks-{i}"
            assert reply["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS

        deadline = time.monotonic() + FINISH_WAIT_S
        while True:  # each rank's writer flushes on its own
            ranks = [read_rank(p) for p in sorted((tmp_path / "traces").glob("*.trace"))]
            done = all(rids <= {r.rid for r in records if isinstance(r, Finish)} for _, records in ranks)
            if (len(ranks) == 2 and done) or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    assert len(ranks) == 2, [h.tp_rank for h, _ in ranks]
    assert sorted(h.tp_rank for h, _ in ranks) == [0, 1]
    assert all(h.tp_size == 2 for h, _ in ranks)
    for header, records in ranks:
        finished = {r.rid for r in records if isinstance(r, Finish)}
        assert rids <= finished, f"tp{header.tp_rank} has no finish for {sorted(rids - finished)}"
    (_, first), (_, second) = ranks
    assert decisions(first, rids) == decisions(second, rids) != []
