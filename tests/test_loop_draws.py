"""The random policy's recorded draws carried onto a closed loop's queue (replay/loop/draws.py)."""

from __future__ import annotations

import pytest

from schedtrace.replay.driver import PassDriver
from schedtrace.replay.loop.draws import RecordedDraws
from schedtrace.testing import builders
from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.order import in_order
from schedtrace.tracer.contract.schema import KvSnapshot, WaitingReq

RECORDED = ("a", "b", "c", "d", "e")
DRAWN = ["d", "a", "e", "c", "b"]  # the server's shuffle of RECORDED at pass 7
DRAWS = RecordedDraws({7: (RECORDED, [3, 1, 0, 1, 4, 1, 2, 1, 1, 1])})


def rows(*rids: str) -> list[WaitingReq]:
    return [WaitingReq(rid, 100, 0, 10, 0) for rid in rids]


def queue(rids: tuple[str, ...], iteration: int = 7) -> list[str]:
    return in_order(list(rids), DRAWS.order_at(iteration, rows(*rids)))


def test_the_recorded_queue_takes_the_recorded_draw() -> None:
    assert queue(RECORDED) == DRAWN


def test_a_queue_one_short_keeps_the_order_the_server_drew() -> None:
    """The loop admitted "d" a pass early: the rest stay as the server shuffled them."""
    assert queue(("a", "b", "c", "e")) == ["a", "e", "c", "b"]
    assert queue(("e", "c", "b", "a")) == ["a", "e", "c", "b"]  # whatever the loop's entry order


def test_a_row_the_recording_lacked_goes_in_at_a_seeded_place() -> None:
    carried = queue(("a", "b", "c", "d", "e", "late"))
    assert [rid for rid in carried if rid != "late"] == DRAWN
    assert carried == queue(("a", "b", "c", "d", "e", "late"))  # deterministic


def test_a_pass_with_no_recorded_draw_draws_its_own() -> None:
    own = queue(RECORDED, iteration=8)
    assert sorted(own) == sorted(RECORDED) and own == queue(RECORDED, iteration=8)
    assert {tuple(queue(RECORDED, iteration=k)) for k in range(8, 20)} != {tuple(RECORDED)}  # it shuffles


def test_a_damaged_draw_is_a_replay_state_error() -> None:
    damaged = RecordedDraws({3: (RECORDED, [0, 9])})
    with pytest.raises(ReplayStateError, match="pass 3 is damaged"):
        damaged.order_at(3, rows("a", "b"))


def test_sglang_admits_the_head_of_the_carried_draw() -> None:
    """The carried order is what sglang's own random pass sorts by: with room for one request,
    the replayed scheduler admits the head the server drew that the loop's queue still holds."""
    header = builders.header(server_args=builders.server_args(schedule_policy="random"))
    waiting = rows("a", "b", "c", "e")
    order = DRAWS.order_at(7, waiting)
    p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=150, evictable=0), req_slots_free=4,
                             order=order)
    decision = PassDriver(header).decide(p, "stock")
    assert in_order([w.rid for w in waiting], decision.queue_order) == ["a", "e", "c", "b"]
    assert [rid for rid, _ in decision.admitted] == ["a"]
