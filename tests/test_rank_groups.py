"""One rank per agreeing TP group is replayed; the copies it gives are what replaying the others gives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from loop_traces import latch_reproduction
from schedtrace.replay.engine import replay_trace
from schedtrace.replay.rank_groups import copied_report, plan_ranks
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Arrival, Footer, Header, Pass, Record
from schedtrace.tracer.contract.traceset import open_traceset

RUN = "run-g"


def _rank(trace: Path, folder: Path, *, tp: int, dp: int = 0, tp_size: int = 2, dp_size: int = 1,
          change: Callable[[list[Record]], None] | None = None) -> Path:
    """``trace`` as one rank of run ``RUN``; ``change`` edits its records first."""
    with TraceReader(trace) as reader:
        header = reader.header
        records = [r for _, r in reader.records() if not isinstance(r, (Header, Footer))]
    if change is not None:
        change(records)
    header = msgspec.structs.replace(header, run_id=RUN, tp_rank=tp, tp_size=tp_size, dp_rank=dp, dp_size=dp_size)
    return write_trace(folder / f"schedtrace-{RUN}-host-tp{tp}-dp{dp}-pp0-pid{1 + tp + 10 * dp}.part000.trace",
                       header, records)


def _ranks(folder: Path):
    return open_traceset([folder]).run(None).ranks


@pytest.fixture(scope="module")
def latch(tmp_path_factory) -> Path:
    return latch_reproduction(tmp_path_factory.mktemp("latch") / "latch.trace")


def _other_decision(records: list[Record]) -> None:
    i, p = next((i, r) for i, r in enumerate(records) if isinstance(r, Pass))
    records[i] = msgspec.structs.replace(p, batch_is_full_out=not p.batch_is_full_out)


def _other_priority(records: list[Record]) -> None:
    i, a = next((i, r) for i, r in enumerate(records) if isinstance(r, Arrival))
    records[i] = msgspec.structs.replace(a, priority=(a.priority or 0) + 7)


def test_an_agreeing_group_replays_its_first_rank_and_the_copy_is_the_other_ranks_replay(tmp_path, latch) -> None:
    for tp in range(4):
        _rank(latch, tmp_path, tp=tp, tp_size=4)
    ranks = _ranks(tmp_path)
    plan = plan_ranks(ranks, run=RUN)
    assert [r.label for r in plan.replayed] == ["tp0"]
    assert plan.same_as == {"tp1": "tp0", "tp2": "tp0", "tp3": "tp0"}
    assert "agreed with tp0" in plan.why["tp3"] and "fidelity" in plan.why["tp3"]
    first = replay_trace(ranks[0], "stock", "fixed")
    copy = copied_report(first, ranks[3], "tp0", plan.why["tp3"])
    own = replay_trace(ranks[3], "stock", "fixed")  # what replaying it would have given
    assert copy.trace == own.trace and copy.trace_fingerprint == own.trace_fingerprint != first.trace_fingerprint
    assert msgspec.structs.replace(copy, same_as=None, same_as_why="") == own
    assert own.divergences and own.stalls["stock"]  # a report with something in it to be equal


@pytest.mark.parametrize("change", [_other_decision, _other_priority], ids=["decision", "arrival"])
def test_a_rank_that_differs_is_replayed_itself(tmp_path, latch, change) -> None:
    _rank(latch, tmp_path, tp=0)
    _rank(latch, tmp_path, tp=1, change=change)
    plan = plan_ranks(_ranks(tmp_path), run=RUN)
    assert [r.label for r in plan.replayed] == ["tp0", "tp1"] and plan.same_as == {}


def test_dp_ranks_are_each_replayed_and_their_tp_ranks_shared(tmp_path, latch) -> None:
    for dp in range(2):
        for tp in range(2):
            _rank(latch, tmp_path, tp=tp, dp=dp, dp_size=2)
    plan = plan_ranks(_ranks(tmp_path), run=RUN)
    replayed = [r.label for r in plan.replayed]
    assert len(replayed) == 2 and len(plan.same_as) == 2
    assert set(plan.same_as.values()) == set(replayed)  # one rank of each DP group stands for its other


def test_one_rank_is_simply_replayed(tmp_path, latch) -> None:
    _rank(latch, tmp_path, tp=0, tp_size=1)
    plan = plan_ranks(_ranks(tmp_path), run=RUN)
    assert len(plan.replayed) == 1 and plan.same_as == {}
