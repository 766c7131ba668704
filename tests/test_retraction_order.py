"""The closed loop's retraction ranking against sglang's own ``_get_decode_retraction_order``,
and the batch order a retraction leaves."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from schedtrace.replay.loop.retraction import BY_LENGTH, RetractionOrder
from schedtrace.replay.loop.state import LoopReq, LoopState, apply_decision
from schedtrace.replay.server_env import PublishedConfig
from schedtrace.tracer.contract.report import Decision


def _reqs(rng: random.Random, n: int) -> list[LoopReq]:
    # few distinct values, so ties (which the sort keeps stable) are common
    return [LoopReq(rid=f"r{i}", input_len=rng.choice((10, 20, 30)), max_new_tokens=50, target_output=50,
                    output_len=rng.randrange(1, 4), priority=rng.choice((None, 0, 1, 2))) for i in range(n)]


@pytest.mark.parametrize("policy, low_first", [("length", False), ("priority", False), ("priority", True)])
def test_the_ranking_is_sglangs(policy: str, low_first: bool) -> None:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    config = PublishedConfig({"retraction_policy": policy, "schedule_low_priority_values_first": low_first})
    order = RetractionOrder(by_priority=policy == "priority", low_values_first=low_first)
    rng = random.Random(f"{policy}-{low_first}")
    for _ in range(200):
        reqs = _reqs(rng, rng.randrange(1, 9))
        rows = [SimpleNamespace(output_ids=[0] * r.output_len, origin_input_ids=[0] * r.input_len,
                                priority=r.priority) for r in reqs]
        with config.installed():
            expected = ScheduleBatch._get_decode_retraction_order(rows)
        assert [reqs.index(r) for r in order.ranked(reqs)] == expected


def test_a_retraction_leaves_the_batch_in_its_ranking() -> None:
    """retract_decode keeps the batch in the ranking's order (filter_batch(keep_indices=sorted_indices)):
    a later retraction's ties and the next pass's running list read it."""
    running = [LoopReq(rid=rid, input_len=100, max_new_tokens=50, target_output=50, output_len=out, kv_tokens=100,
                       kv_held=100) for rid, out in (("a", 1), ("c", 2), ("b", 3))]
    s = LoopState(waiting=[], running=running, chunked=None, batch_is_full=False, free=500, evictable=0,
                  req_slots_free=1, forward_ct=4)
    after, result = apply_decision(s, Decision(admitted=[]), page_size=1, radix_cache=True, retract_every=4,
                                   retraction=BY_LENGTH)
    assert result.retracted == ["a"] and [r.rid for r in after.running] == ["b", "c"]
    kept, _ = apply_decision(s, Decision(admitted=[]), page_size=1, radix_cache=True)
    assert [r.rid for r in kept.running] == ["a", "c", "b"]  # no retraction: the batch's order
