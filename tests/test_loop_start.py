"""A closed loop's start: mid-trace, what the last forward has in flight under the overlap
scheduler (replay/loop/in_flight.py), a shared prompt the server holds once
(replay/loop/tree_share.settle_start) and the requeues before it; for every arm, the
requests' history as recorded (PassDriver.start_over)."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedtrace.replay.loop.arm_tree import MatchHistory
from schedtrace.replay.loop.in_flight import last_forward, mark_in_flight
from schedtrace.replay.loop.run import run_arms, run_closed_loop
from schedtrace.replay.loop.state import LoopReq, LoopState
from schedtrace.replay.loop.tree_share import settle_start
from schedtrace.testing.builders import pass_record
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.prefix_ids import prefix_ids
from schedtrace.tracer.contract.schema import Admitted

ROOT = Path(__file__).parent.parent
DFS_WEIGHT = ROOT / "tests" / "traces" / "dfs-weight-branch-order.trace"
PRIORITY_PREEMPT = ROOT / "traces" / "priority-preempt-fcfs.trace"
MAMBA_RETRACT = ROOT / "tests" / "traces" / "mamba-retract-then-preempt.trace"
EVICTED_FORK = ROOT / "tests" / "traces" / "mamba-priority-evicted-fork.trace"
RELEASED_TOGETHER = ROOT / "tests" / "traces" / "fcfs-low-first-released-together.trace"


def _running(rid: str, input_len: int, output_len: int, ids: bytes = b"") -> LoopReq:
    tokens = input_len + max(output_len - 1, 0)  # as initial_state holds a recorded running row
    return LoopReq(rid, input_len, 64, 64, output_len=output_len, kv_tokens=tokens, kv_held=tokens, prefix_ids=ids)


def _state(running: list[LoopReq]) -> LoopState:
    return LoopState(waiting=[], running=running, chunked=None, batch_is_full=False, free=1000, evictable=0,
                     req_slots_free=4)


def test_the_forward_before_a_prefill_pass_ran_its_prefills_only() -> None:
    prefill = pass_record(9, admitted=[Admitted(rid="new", prefix_len=0, extend_len=100)])
    assert last_forward(prefill, mixed_chunk=False) == {"new"}
    assert last_forward(prefill, mixed_chunk=True) is None  # the running batch decoded in it too
    assert last_forward(pass_record(9), mixed_chunk=False) is None  # a decode of every running request
    assert last_forward(None, mixed_chunk=False) is None  # the scheduler idled: a decode too

    decoding, new = _running("old", 100, 7), _running("new", 100, 0)
    state = _state([decoding, new])
    mark_in_flight(state, prefill, mixed_chunk=False)
    # The prefill's first token is in flight; the decoding request did not run in that forward.
    assert (new.output_len, new.inflight, new.kv_held) == (1, 1, 100)
    assert (decoding.output_len, decoding.inflight, decoding.kv_held) == (7, 0, 106)

    decoding = _running("old", 100, 7)
    mark_in_flight(_state([decoding]), None, mixed_chunk=False)
    # Its newest token is in flight, and KV holds the slot that decode wrote.
    assert (decoding.output_len, decoding.inflight, decoding.kv_held) == (8, 1, 107)


def test_two_running_prompts_of_one_family_hold_their_shared_pages_once() -> None:
    key, shared = bytes(32), list(range(600))
    first = _running("a", 700, 5, prefix_ids(key, shared + list(range(1000, 1100)), 16))
    second = _running("b", 650, 3, prefix_ids(key, shared + list(range(2000, 2050)), 16))
    landing = _running("c", 640, 1, prefix_ids(key, shared + list(range(3000, 3040)), 16))
    landing.inflight = 1  # its prefill's result is not processed yet: not in the tree, nothing shared
    state = _state([first, second, landing])
    # The ids agree for 37 blocks (592 tokens); a recorded match inside block 38 says 600.
    settle_start(state, page_size=1, block=16, history=MatchHistory([(0, "b", 600, None)]))
    assert (first.tree_len, first.kv_held, first.lender) == (700, 704, None)
    assert (second.tree_len, second.kv_held, second.kv_shared, second.lender) == (650, 652 - 600, 600, "a")
    assert (landing.tree_len, landing.tree_landing, landing.kv_held, landing.kv_shared) == (0, 640, 640, 0)


def test_a_prefill_in_flight_holds_once_what_its_earlier_chunk_put_in_the_tree() -> None:
    """Its last chunk is in flight (overlap), but the chunk before it reached the tree at the pass
    before (stash_chunked_request), and ``_insert_cache`` freed the part a sibling held already."""
    key, shared = bytes(32), list(range(600))
    sibling = _running("a", 912, 2, prefix_ids(key, shared + list(range(1000, 1312)), 16))
    landing = _running("b", 936, 1, prefix_ids(key, shared + list(range(2000, 2336)), 16))
    landing.inflight = 1
    settle_start(_state([sibling, landing]), page_size=1, block=16, in_tree_before={"b": 318})
    assert (landing.tree_len, landing.tree_landing) == (318, 936)
    assert (landing.kv_held, landing.kv_shared, landing.lender) == (936 - 318, 318, "a")


def test_requests_released_together_before_the_start_are_requeued_in_the_order_released() -> None:
    """``w1s2`` and ``w1s1``, released together at pass 357, re-entered the queue in that order, and
    the preemption at 436 takes the newest first: ``w1s1``. Stamped at one time, the loop from 360
    took ``w1s2``, and ``w2s2`` got in 5 passes early (12.2% p90)."""
    run = run_arms(RELEASED_TOGETHER, ["stock"], from_pass=360)["stock"]
    at_437 = next(p for p in run.passes if p.seq == 437)
    assert {r.rid for r in at_437.running} == {"fcfs-low-first-w2s0", "fcfs-low-first-w1s2"}
    check = run_closed_loop(RELEASED_TOGETHER, ["stock"], from_pass=360).self_check
    assert check.requests >= 8 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check


def test_a_loop_from_beside_a_landing_chunk_frees_what_the_server_did() -> None:
    """At pass 360 ``w2f0m1``'s last chunk is in flight; its first 318 tokens, shared with
    ``w2f0m3``, were freed when that chunk was stashed. Held again, its landing freed them twice
    (the loop's free and evictable 310 tokens above the recording's at pass 361). What is left is
    inside a block: the ids say 592 shared, the server 600."""
    run = run_arms(RELEASED_TOGETHER, ["stock"], from_pass=360)["stock"]
    at_361 = next(p for p in run.passes if p.seq == 361)
    with TraceReader(RELEASED_TOGETHER) as reader:
        recorded = replay_inputs(reader.pass_at(361)).kv
    offset = (at_361.kv.available + at_361.kv.evictable) - (recorded.available + recorded.evictable)
    assert -16 < offset <= 0


def test_a_family_member_gone_before_the_start_says_where_its_prompts_part() -> None:
    key, shared = bytes(32), list(range(600))
    ids = {rid: prefix_ids(key, shared + list(range(base, base + 80)), 16)
           for rid, base in (("a", 1000), ("b", 2000), ("gone", 3000))}
    first, second = _running("a", 680, 5, ids["a"]), _running("b", 680, 3, ids["b"])
    history = MatchHistory([(-40, "gone", 600, None)])
    settle_start(_state([first, second]), page_size=1, block=16, history=history, prompts=ids)
    assert (second.kv_shared, second.lender) == (600, "a")
    first, second = _running("a", 680, 5, ids["a"]), _running("b", 680, 3, ids["b"])
    settle_start(_state([first, second]), page_size=1, block=16, history=history)  # the state's own only
    assert (second.kv_shared, second.lender) == (592, "a")


@pytest.mark.parametrize(("trace", "from_pass"), [
    # Each pass raised before a running row took its arrival's priority; without the outputs in flight
    # 3.3% p90
    (PRIORITY_PREEMPT, 79),
    (PRIORITY_PREEMPT, 31),  # without the queue entry times of the requeues before the start: 6.7% p90
    (DFS_WEIGHT, 211),  # 9.5% p90
    # Its families' branches ranked by first arrival, not by the order their first prefills entered the
    # tree (a new chunk before its pass's whole prefills, under overlap): 5.7% / 12.9%
    (DFS_WEIGHT, 84),
    (DFS_WEIGHT, 40),  # without the shared prompts held once as well: 48% / 93%
    # Two running prompts of one family part inside a block, and neither's match says where: a
    # member that finished before the start matched 600 (with the ids' 592 alone: 65% / 94%)
    (DFS_WEIGHT, 140),
])
def test_a_closed_loop_from_mid_trace_reproduces_the_recording(trace: Path, from_pass: int) -> None:
    loop = run_closed_loop(trace, ["stock"], from_pass=from_pass)
    assert loop.arms["stock"].exceptions == 0, loop.arms["stock"].errors
    check = loop.self_check
    assert check.loop_queue_peak == check.recorded_queue_peak, check
    assert check.requests >= 10 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check


@pytest.mark.parametrize(("trace", "from_pass", "rid", "prefix"), [
    # Its last prefill filled its prompt, whose forked mamba state the tree kept: it matches all of it
    # at pass 61 (the loop re-matched nothing, 25% p90)
    (MAMBA_RETRACT, 60, "mamba-priority-w2f0m1", 924),
    # Its match shrinks to what a candidate row after its requeue shows (the tree had evicted its
    # fork), not to one from before that requeue (its first admission's family match: 64% p90)
    (EVICTED_FORK, 120, "mamba-priority-w1f1m2", 0),
])
def test_a_request_waiting_requeued_at_the_start_matches_its_own_last_fill(
        trace: Path, from_pass: int, rid: str, prefix: int) -> None:
    run = run_arms(trace, ["stock"], from_pass=from_pass)["stock"]
    assert next(a.prefix_len for p in run.passes for a in p.admitted if a.rid == rid) == prefix
    check = run_closed_loop(trace, ["stock"], from_pass=from_pass).self_check
    assert check.requests >= 5 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check


def test_a_request_requeued_before_the_start_holds_the_outputs_it_refilled_in_the_tree() -> None:
    """``dfs-weight-w1f1m2`` was retracted at one output before pass 84 and prefilled that output
    again with its prompt (846 + 1 tokens into the tree); retracted again, it matches all 847 at pass
    88, as recorded. Counting the prompt alone, the loop matched 846 and held a token too few."""
    run = run_arms(DFS_WEIGHT, ["stock"], from_pass=84)["stock"]
    at_88 = next(p for p in run.passes if p.seq == 88)
    row = next(w for w in at_88.waiting if w.rid == "dfs-weight-w1f1m2")
    assert (row.output_len, row.prefix_len) == (6, 847)


def test_an_arms_closed_loop_does_not_depend_on_the_arms_before_it() -> None:
    """Arms share one driver; under priority preemption the queue entry times a stock run
    stamped on its requeues once ranked the fixed arm's victims (its waits then differed)."""
    alone = run_arms(PRIORITY_PREEMPT, ["fixed"])["fixed"].outcome
    after_stock = run_arms(PRIORITY_PREEMPT, ["stock", "fixed"])["fixed"].outcome
    assert alone.retractions + sum(1 for _ in alone.first_admission_passes) > 0
    assert after_stock == alone
