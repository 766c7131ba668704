"""PassDriver takes a pass's waiting Reqs only when sglang's pass reaches calc_priority: a pass that
returns before it (a latched or full batch) reads nothing of the queue but its length."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedtrace.replay import driver as driver_module
from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Arrival, Finish, Pass, Retract

LATCH = Path(__file__).parent.parent / "traces" / "latch-abort-live.trace"


def _decisions(arm: str) -> tuple[list, int]:
    with TraceReader(LATCH) as reader:
        driver = PassDriver(reader.header)
        decisions, unread = [], 0
        for _, record in reader.records():
            if isinstance(record, Pass):
                decisions.append(driver.decide(replay_inputs(record), arm))
                unread += driver._built is None and bool(record.waiting)
            elif isinstance(record, (Arrival, Finish, Retract)):
                driver.note(record)
    return decisions, unread


@pytest.mark.parametrize("arm", ["stock", "fixed"])
def test_leaving_the_queue_unbuilt_decides_as_building_it(arm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lazy, unread = _decisions(arm)
    monkeypatch.setattr(driver_module, "reads_queue_early", lambda fixes: True)  # build the queue first
    eager, none_unread = _decisions(arm)
    assert lazy == eager
    assert none_unread == 0
    if arm == "stock":
        assert unread > 100  # the latch held: those passes returned before calc_priority
