"""Pure tests of the closed-loop state machine (schedtrace.replay.loop.state, PassClock).

No driver here: each test hands ``apply_decision`` the decision a pass would
have made and checks the bookkeeping (KV, slots, latch, chunks, finishes).
The closed loop against the real sglang code is in tests/test_closed_loop.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedtrace.replay.loop.run import PassClock
from schedtrace.replay.loop.ratio import RatioRule
from schedtrace.replay.loop.state import LoopReq, LoopState, abort_chunked, apply_decision, ceil_page, to_pass
from schedtrace.tracer.contract.prefix_ids import prefix_ids
from schedtrace.tracer.contract.report import Decision


def running(rid: str, input_len: int = 100, output_len: int = 5, target: int = 10) -> LoopReq:
    tokens = input_len + output_len - 1
    return LoopReq(
        rid=rid, input_len=input_len, max_new_tokens=50, target_output=target,
        output_len=output_len, kv_tokens=tokens, kv_held=tokens,
    )


def waiting(rid: str, input_len: int = 100, target: int = 3, prefix_len: int = 0) -> LoopReq:
    return LoopReq(rid=rid, input_len=input_len, max_new_tokens=50, target_output=target, prefix_len=prefix_len)


def state(**kw) -> LoopState:
    base = dict(waiting=[], running=[], chunked=None, batch_is_full=False, free=1000, evictable=0, req_slots_free=4)
    base.update(kw)
    return LoopState(**base)


def step(s: LoopState, decision: Decision, page_size: int = 1, radix: bool = True):
    return apply_decision(s, decision, page_size=page_size, radix_cache=radix)


def total_kv(s: LoopState) -> int:
    held = sum(r.kv_held for r in (*s.running, *s.waiting)) + (s.chunked.kv_held if s.chunked else 0)
    return s.free + s.evictable + held


def test_admission_allocates_extend_and_a_slot_then_the_request_runs():
    s = state(waiting=[waiting("a", 100)])
    after, result = step(s, Decision(admitted=[("a", 100)]))
    assert result.admitted == ["a"] and not result.failed
    assert after.waiting == [] and [r.rid for r in after.running] == ["a"]
    assert after.running[0].output_len == 1  # the prefill sampled the first token
    assert after.free == 900 and after.req_slots_free == 3
    assert s.free == 1000 and s.waiting[0].rid == "a"  # the input state is untouched


def test_decode_grows_each_running_request_by_one_token_per_pass():
    s = state(running=[running("a"), running("b")], free=10)
    after, _ = step(s, Decision(admitted=[]))
    assert [r.output_len for r in after.running] == [6, 6]
    assert after.free == 8


def test_page_rounded_allocation():
    assert ceil_page(1, 16) == 16 and ceil_page(16, 16) == 16 and ceil_page(17, 16) == 32
    s = state(waiting=[waiting("a", 20)], free=64)
    after, _ = step(s, Decision(admitted=[("a", 20)]), page_size=16)
    assert after.free == 32


def test_finish_frees_kv_to_evictable_and_clears_the_latch():
    s = state(running=[running("a", 100, output_len=9, target=10), running("b")], batch_is_full=True, free=50)
    after, result = step(s, Decision(admitted=[], batch_is_full=True))
    assert result.finished == ["a"]
    assert [r.rid for r in after.running] == ["b"]
    assert after.evictable == 109 and after.req_slots_free == 5
    assert after.batch_is_full is False  # the batch shrank
    assert total_kv(after) == total_kv(s)


def test_finish_without_radix_cache_frees_kv_directly():
    s = state(running=[running("a", 100, output_len=9, target=10)], free=50)
    after, _ = step(s, Decision(admitted=[]), radix=False)
    assert after.evictable == 0 and after.free == 50 - 1 + 109  # one decode token, then all of it


def test_the_latch_is_carried_from_the_decision_while_the_batch_does_not_shrink():
    s = state(running=[running("a")], waiting=[waiting("w")], batch_is_full=True)
    after, _ = step(s, Decision(admitted=[], batch_is_full=True))
    assert after.batch_is_full is True
    after, _ = step(s, Decision(admitted=[], batch_is_full=False))
    assert after.batch_is_full is False


def test_allocation_evicts_when_free_runs_out():
    s = state(waiting=[waiting("a", 100)], free=40, evictable=100)
    after, result = step(s, Decision(admitted=[("a", 100)]))
    assert not result.failed
    assert after.free == 0 and after.evictable == 40


def test_an_over_ask_admits_nothing():
    s = state(waiting=[waiting("a", 100)], free=40)
    after, result = step(s, Decision(admitted=[("a", 100)], over_ask=60))
    assert result.failed and result.kv_shortfall == 60
    assert [r.rid for r in after.waiting] == ["a"] and after.free == 40


def test_an_allocation_beyond_free_plus_evictable_admits_nothing_even_unreported():
    s = state(waiting=[waiting("a", 100)], free=40)
    after, result = step(s, Decision(admitted=[("a", 100)]))
    assert result.failed and result.kv_shortfall == 60
    assert after.waiting[0].rid == "a"


def test_a_raising_pass_admits_nothing_but_decode_goes_on():
    s = state(waiting=[waiting("a")], running=[running("r")], batch_is_full=False)
    after, result = step(s, Decision(admitted=[("a", 100)], error="AssertionError: "))
    assert result.failed
    assert after.waiting[0].rid == "a" and after.running[0].output_len == 6


def test_a_new_chunk_then_its_continuation_then_it_runs():
    s = state(waiting=[waiting("a", 250)])
    s1, _ = step(s, Decision(admitted=[("a", 100)], new_chunked_rid="a"))
    assert s1.chunked is not None and s1.chunked.prefix_len == 100 and s1.running == []
    assert s1.req_slots_free == 3 and s1.free == 900
    s2, _ = step(s1, Decision(admitted=[("a", 100)], chunk_size=100))
    assert s2.chunked.prefix_len == 200 and s2.req_slots_free == 3
    s3, _ = step(s2, Decision(admitted=[("a", 50)], chunk_size=50))
    assert s3.chunked is None and [r.rid for r in s3.running] == ["a"]
    assert s3.free == 750 and s3.running[0].output_len == 1


def test_a_deferred_chunk_stays_where_it_was():
    s = state(waiting=[waiting("a", 250)])
    s1, _ = step(s, Decision(admitted=[("a", 100)], new_chunked_rid="a"))
    s2, _ = step(s1, Decision(admitted=[], chunk_size=None, chunk_budget=None))
    assert s2.chunked.prefix_len == 100 and s2.free == s1.free


def test_a_cached_prefix_leaves_the_evictable_count_on_admission():
    s = state(waiting=[waiting("a", 100, prefix_len=30)], free=500, evictable=30)
    after, _ = step(s, Decision(admitted=[("a", 70)]))
    assert after.evictable == 0 and after.free == 430
    assert after.running[0].kv_held == 100


def test_decode_that_does_not_fit_retracts_in_sglang_order():
    # b has fewer outputs than a: it goes first; at least one request stays.
    a = running("a", 100, output_len=8, target=50)
    b = running("b", 100, output_len=2, target=50)
    s = state(running=[a, b], free=1, req_slots_free=2)
    after, result = step(s, Decision(admitted=[]))
    assert result.retracted == ["b"]
    assert [r.rid for r in after.running] == ["a"] and after.running[0].output_len == 9
    assert [r.rid for r in after.waiting] == ["b"]
    back = after.waiting[0]
    assert back.output_len == 2 and back.prefix_len == 0 and back.kv_held == 0
    assert after.req_slots_free == 3 and after.batch_is_full is False
    assert total_kv(after) == total_kv(s)


def test_a_retracted_request_refills_its_outputs():
    back = LoopReq(rid="b", input_len=100, max_new_tokens=50, target_output=50, output_len=2)
    s = state(waiting=[back])
    after, _ = step(s, Decision(admitted=[("b", 102)]))
    assert after.running[0].output_len == 3 and after.free == 1000 - 102


def test_signature_sees_every_decision_input():
    s = state(waiting=[waiting("a")])
    t = s.copy()
    assert s.signature() == t.signature()
    t.free -= 1
    assert s.signature() != t.signature()


def test_to_pass_carries_the_inputs():
    s = state(waiting=[waiting("a", 100, prefix_len=7)], running=[running("r")], batch_is_full=True, free=12, evictable=3)
    p = to_pass(s, seq=5, t_ns=99, new_token_ratio=0.4, chunked_prefill_size=256)
    assert (p.seq, p.t_ns, p.batch_is_full_in, p.kv.available, p.kv.evictable) == (5, 99, True, 12, 3)
    assert p.waiting[0].prefix_len == 7 and p.running[0].output_len == 5
    assert p.req_slots_free == 4 and p.chunked_prefill_size == 256 and p.new_token_ratio == 0.4


def test_pass_clock_interpolates_and_extrapolates():
    clock = PassClock([(0, 0), (10, 1_000), (12, 3_000)])
    assert clock.iteration_at(0) == 0
    assert clock.iteration_at(500) == 5
    assert clock.iteration_at(501) == 6  # the first pass at or after the time
    assert clock.iteration_at(2_000) == 11
    assert clock.period_ns == 250
    assert clock.iteration_at(3_500) == 14
    assert clock.time_at(5) == 500 and clock.time_at(14) == 3_500


def test_pass_clock_survives_a_clock_running_backwards():
    clock = PassClock([(0, 1_000), (5, 500), (10, 2_000)])
    assert clock.times == [1_000, 1_000, 2_000]
    assert clock.iteration_at(1_500) == 8


def test_an_untracked_unfinished_chunk_runs_on_part_of_its_prompt():
    # Two new chunks in one pass: only the decision's new_chunked_rid is tracked.
    s = state(waiting=[waiting("a", 300), waiting("b", 300)])
    after, result = step(s, Decision(admitted=[("a", 100), ("b", 50)], new_chunked_rid="b"))
    assert after.chunked.rid == "b" and after.chunked.prefix_len == 50
    assert [r.rid for r in after.running] == ["a"] and after.running[0].output_len == 1
    assert result.truncated == ["a"]
    assert after.free == 1000 - 150 and after.req_slots_free == 2


# --------------------------------------------- the forward step of a pass


def test_a_prefill_pass_decodes_nothing_unless_mixed_chunk():
    # Scheduler.get_next_batch_to_run runs the new prefill batch instead of the decode.
    s = state(waiting=[waiting("a", 100)], running=[running("r")], free=1000)
    after, _ = step(s, Decision(admitted=[("a", 100)]))
    assert {r.rid: r.output_len for r in after.running} == {"r": 5, "a": 1}
    assert after.free == 900
    mixed, _ = apply_decision(s, Decision(admitted=[("a", 100)]), page_size=1, radix_cache=True, mixed_chunk=True)
    assert {r.rid: r.output_len for r in mixed.running} == {"r": 6, "a": 1} and mixed.free == 899


def test_a_continuing_chunk_is_a_prefill_pass_too():
    s = state(running=[running("r")], chunked=waiting("c", 300, prefix_len=100))
    s.chunked.kv_held = s.chunked.kv_tokens = 100
    after, _ = step(s, Decision(admitted=[("c", 100)], chunk_size=100))
    assert after.chunked.prefix_len == 200 and after.running[0].output_len == 5


def overlap_step(s: LoopState, decision: Decision) -> tuple[LoopState, object]:
    return apply_decision(s, decision, page_size=1, radix_cache=True, overlap=True)


def test_overlap_the_next_pass_sees_a_step_short_and_a_finished_request_leaves_a_step_later():
    """event_loop_overlap processes a step's results after deciding the next pass."""
    s = state(waiting=[waiting("a", 100, target=2)])
    s1, _ = overlap_step(s, Decision(admitted=[("a", 100)]))
    a = s1.running[0]
    assert (a.output_len, a.inflight) == (1, 1)
    assert to_pass(s1, seq=1, t_ns=0, new_token_ratio=0.5, chunked_prefill_size=None).running[0].output_len == 0
    s2, r2 = overlap_step(s1, Decision(admitted=[]))  # decodes the second and last output
    assert s2.running[0].output_len == 2 and r2.finished == []  # its result is not processed yet
    assert to_pass(s2, seq=2, t_ns=0, new_token_ratio=0.5, chunked_prefill_size=None).running[0].output_len == 1
    s3, r3 = overlap_step(s2, Decision(admitted=[]))
    assert r3.finished == ["a"] and s3.running == []
    assert s3.free + s3.evictable == 1000 and s3.evictable == 101  # no extra decode token for it
    # Without overlap it leaves one step earlier.
    t1, _ = step(s, Decision(admitted=[("a", 100)]))
    t2, r = step(t1, Decision(admitted=[]))
    assert r.finished == ["a"]


def test_overlap_a_request_not_in_the_last_batch_shows_every_output():
    s = state(waiting=[waiting("b", 50)], running=[running("r")])
    s.running[0].inflight = 1
    after, _ = overlap_step(s, Decision(admitted=[("b", 50)]))  # a prefill pass: r does not decode
    r = next(x for x in after.running if x.rid == "r")
    assert (r.output_len, r.inflight) == (5, 0)


# ------------------------------------------------ prefixes shared with running requests


def test_a_match_partly_shared_with_a_running_request_allocates_only_the_extend():
    # 60 of the 80 matched tokens are protected (a running prompt holds them), 20 are evictable.
    holder = running("h", input_len=400, output_len=2, target=4)
    w = waiting("w", 100, prefix_len=80)
    w.prefix_cached = 20
    s = state(waiting=[w], running=[holder], free=500, evictable=50)
    after, result = step(s, Decision(admitted=[("w", 20)]))
    assert not result.failed
    b = next(r for r in after.running if r.rid == "w")
    assert (b.lender, b.kv_shared, b.kv_held) == ("h", 60, 40)  # 20 pinned + 20 allocated
    assert (after.free, after.evictable) == (480, 30)
    assert after.pool_totals() == s.pool_totals()


def test_the_borrower_keeps_the_shared_tokens_when_its_lender_finishes_first():
    holder = running("h", input_len=400, output_len=3, target=4)
    w = waiting("w", 100, prefix_len=80, target=50)
    w.prefix_cached = 0
    s = state(waiting=[w], running=[holder], free=500)
    s1, _ = step(s, Decision(admitted=[("w", 20)]))
    s2, result = step(s1, Decision(admitted=[]))  # h decodes its last output and leaves
    assert result.finished == ["h"]
    b = s2.running[0]
    assert (b.lender, b.kv_shared, b.kv_held) == (None, 0, 80 + 21)  # the 80 shared are its own now
    assert s2.evictable == 403 - 80  # h cached only what nobody else holds
    assert s2.pool_totals() == s.pool_totals()


def test_a_protected_match_is_lent_by_the_prompt_its_ids_share_not_the_longest_running():
    """A request of another family holds no page of the match, however long it runs: lent by it,
    two borrowers of one family's prefix each took the pages over when both lenders left in one
    step, and the loop held the prefix twice (600 tokens short of evictable on a fresh dfs-weight
    recording from pass 225)."""
    key, family = bytes(32), list(range(600))
    other = running("other", input_len=1700, output_len=2, target=40)
    other.prefix_ids = prefix_ids(key, list(range(5000, 6700)), 16)
    sibling = running("sibling", input_len=900, output_len=2, target=6)
    sibling.prefix_ids = prefix_ids(key, family + list(range(1000, 1300)), 16)
    w = waiting("w", 700, prefix_len=600, target=20)
    w.prefix_cached, w.prefix_ids = 0, prefix_ids(key, family + list(range(2000, 2100)), 16)
    s = state(waiting=[w], running=[other, sibling], free=500)
    after = apply_decision(s, Decision(admitted=[("w", 100)]), page_size=1, radix_cache=True, prefix_block=16)[0]
    assert next(r for r in after.running if r.rid == "w").lender == "sibling"


def test_a_protected_match_no_running_request_can_hold_is_allocated():
    w = waiting("w", 100, prefix_len=80)
    w.prefix_cached = 0
    s = state(waiting=[w], running=[running("short", input_len=10)], free=500)
    after, _ = step(s, Decision(admitted=[("w", 20)]))
    b = next(r for r in after.running if r.rid == "w")
    assert (b.lender, b.kv_shared, b.kv_held) == (None, 0, 100) and after.free == 400


# --- the retraction test hook, the new-token ratio, preemption ---

RULE = RatioRule(init=0.7, min=0.098, decay=(0.7 - 0.098) / 600, retract_decode_steps=20)


def test_the_retract_hook_retracts_one_at_a_multiple_of_its_interval_and_counts_forwards():
    s = state(running=[running("a", output_len=9, target=40), running("b", output_len=2)], forward_ct=14)
    after, result = apply_decision(s, Decision(admitted=[]), page_size=1, radix_cache=True, retract_every=7)
    assert result.retracted == ["b"] and after.forward_ct == 15  # room for both: the hook alone retracts
    again, result = apply_decision(after, Decision(admitted=[]), page_size=1, radix_cache=True, retract_every=7)
    assert result.retracted == [] and again.forward_ct == 16
    unrecorded, result = step(state(running=[running("a"), running("b", output_len=2)]), Decision(admitted=[]))
    assert result.retracted == [] and unrecorded.forward_ct is None


def test_the_ratio_moves_as_sglangs_tracker():
    """The mirror against sglang's own NewTokenRatioTracker, on real Reqs."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.sampling.sampling_params import SamplingParams

    tracker = NewTokenRatioTracker(init=RULE.init, min=RULE.min, decay=RULE.decay, current=0.5)
    tracker.decay_step()
    assert RULE.decayed(0.5) == tracker.current
    assert RULE.decayed(RULE.min) == RULE.min
    kept = [running("a", output_len=9, target=40), running("b", output_len=30)]
    reqs = []
    for r in kept:
        req = Req(r.rid, "", [1] * r.input_len, SamplingParams(max_new_tokens=r.max_new_tokens))
        req.output_ids = [2] * r.output_len
        reqs.append(req)
    assert RULE.after_retract(kept) == pytest.approx(NewTokenRatioTracker.estimate_new_token_ratio_after_retract(reqs))


def test_a_decode_step_decays_the_ratio_a_retraction_resets_it_and_idling_restores_init():
    s = state(running=[running("a", output_len=9, target=40), running("b", output_len=2)], forward_ct=13, new_token_ratio=0.5)
    after, _ = apply_decision(s, Decision(admitted=[]), page_size=1, radix_cache=True, retract_every=7, ratio=RULE)
    assert after.new_token_ratio == RULE.decayed(0.5)
    kept_before = [replace(r) for r in after.running if r.rid == "a"]
    retracted, result = apply_decision(after, Decision(admitted=[]), page_size=1, radix_cache=True, retract_every=7,
                                       ratio=RULE)
    assert result.retracted == ["b"] and retracted.new_token_ratio == RULE.after_retract(kept_before)
    idle, _ = apply_decision(state(new_token_ratio=0.3), Decision(admitted=[]), page_size=1, radix_cache=True, ratio=RULE)
    assert idle.new_token_ratio == RULE.init


def test_a_preempted_request_frees_its_kv_and_queues_at_the_end_with_its_outputs():
    s = state(running=[running("a", output_len=9, target=40), running("b", output_len=2)], waiting=[waiting("w")], free=500)
    held = s.running[1].kv_held
    after, _ = step(s, Decision(admitted=[], released=["b"]))
    assert [r.rid for r in after.waiting] == ["w", "b"] and after.waiting[-1].output_len == 2
    assert after.waiting[-1].kv_held == 0 and after.req_slots_free == 5 and total_kv(after) == total_kv(s)
    assert after.free >= 500 + held - 1  # freed, less the one decode token of "a"


def test_the_ratio_defaults_are_sglangs():
    """For traces that recorded no settings: the mirror's defaults against sglang's own."""
    from sglang.srt.environ import envs

    from schedtrace.replay.loop import ratio

    assert ratio._DEFAULTS == {name: getattr(envs, name).default for name in ratio._DEFAULTS}


# --- what a retracted request finds in the tree ---


def _prefilled_then_hooked(overlap: bool, page_size: int = 1, input_len: int = 100):
    """b prefills beside a running a; the retraction hook then retracts b (the fewer outputs)."""
    s = state(waiting=[waiting("b", input_len, target=50)], running=[running("a", output_len=8, target=50)])
    kw = dict(page_size=page_size, radix_cache=True, overlap=overlap, retract_every=7)
    prefilled, _ = apply_decision(s, Decision(admitted=[("b", input_len)]), **kw)
    prefilled.forward_ct = 14
    return s, prefilled, apply_decision(prefilled, Decision(admitted=[]), **kw)


def test_a_retracted_request_matches_what_its_prefill_put_in_the_tree():
    """release_kv_cache unlocks what checkpoint_kv_cache inserted (it stays, evictable) and frees
    the decode tokens; queued again, the request matches it (the dfs-weight trace: 884 of 886)."""
    before, _, (after, result) = _prefilled_then_hooked(overlap=False)
    assert result.retracted == ["b"]
    back = after.waiting[0]
    assert (back.output_len, back.prefix_len, back.prefix_cached, back.kv_held) == (1, 100, None, 0)
    assert after.evictable == 100 and total_kv(after) == total_kv(before)
    readmitted, _ = step(after, Decision(admitted=[("b", 1)]))
    assert readmitted.evictable == 0 and readmitted.free == after.free - 1  # only the extend is new


def test_the_tree_holds_whole_pages_of_a_prefill():
    _, _, (after, _) = _prefilled_then_hooked(overlap=False, page_size=16, input_len=100)
    assert after.waiting[0].prefix_len == 96 and after.evictable == 96


def test_overlap_a_request_retracted_before_its_prefill_result_is_processed_matches_nothing():
    """The result processor skips a retracted request: its prefill never reached the tree and its
    in-flight first output is dropped (the dfs-weight trace: retracted at output 0, matched 0)."""
    before, prefilled, (after, result) = _prefilled_then_hooked(overlap=True)
    assert prefilled.running[-1].tree_len == 0  # inserted only when the result is processed
    assert result.retracted == ["b"]
    back = after.waiting[0]
    assert (back.output_len, back.prefix_len, back.tree_landing) == (0, 0, 0)
    assert after.evictable == 0 and total_kv(after) == total_kv(before)


def test_overlap_a_retracted_request_still_matches_the_prefix_it_was_admitted_with():
    """Its own prefill never reached the tree, but the prefix it matched was there already:
    release_kv_cache unlocks it, and queued again the request matches it (the dfs-weight trace:
    admitted with 600 of 856 cached, retracted at output 0, re-admitted with 600)."""
    s = state(waiting=[waiting("b", 856, target=50, prefix_len=600)], running=[running("a", output_len=8, target=50)],
              evictable=600)
    kw = dict(page_size=1, radix_cache=True, overlap=True, retract_every=7)
    prefilled, _ = apply_decision(s, Decision(admitted=[("b", 256)]), **kw)
    assert prefilled.evictable == 0  # the match is locked while it runs
    prefilled.forward_ct = 14
    after, result = apply_decision(prefilled, Decision(admitted=[]), **kw)
    assert result.retracted == ["b"]
    back = after.waiting[0]
    assert (back.output_len, back.prefix_len) == (0, 600)
    assert after.evictable == 600 and total_kv(after) == total_kv(s)


def test_a_client_abort_ends_the_chunked_request_and_keeps_its_landed_chunks_cached():
    """Scheduler.process_pending_chunked_abort: at the top of the next step the chunked request
    is released; its landed chunk stays in the tree (the mamba-lpm trace: 873 tokens to evictable,
    the chunk in flight freed)."""
    s = state(waiting=[waiting("c", 3000, target=3000)], free=5000, req_slots_free=2)
    kw = dict(page_size=1, radix_cache=True)
    first, _ = apply_decision(s, Decision(admitted=[("c", 873)], new_chunked_rid="c"), **kw)
    second, _ = apply_decision(first, Decision(admitted=[("c", 1024)], chunk_size=1024), **kw)
    assert second.chunked is not None and second.chunked.prefix_len == 1897
    aborted = abort_chunked(second, **kw)
    assert aborted.chunked is None and aborted.req_slots_free == 2
    assert aborted.evictable == second.chunked.tree_len and total_kv(aborted) == total_kv(s)
    assert second.chunked is not None  # the input state is untouched


def _family(rid: str, shared: bytes, own: bytes, input_len: int = 100) -> LoopReq:
    return replace(waiting(rid, input_len, target=50), prefix_ids=shared + own)


def test_a_prefill_that_lands_on_a_siblings_prefix_frees_its_copy_and_shares_the_siblings():
    """RadixCache._insert_cache frees the duplicates an insert exposes: two members of a prefix family
    prefilled in one batch each computed the shared blocks; the second to land keeps the first's."""
    shared, a_own, b_own = bytes(8) * 2, b"A" * 8 * 5, b"B" * 8 * 5  # 2 shared ids of 16 tokens, then their own
    s = state(waiting=[_family("a", shared, a_own), _family("b", shared, b_own)])
    admitted = Decision(admitted=[("a", 100), ("b", 100)])
    after, _ = apply_decision(s, admitted, page_size=1, radix_cache=True, prefix_block=16)
    a, b = after.running
    assert (a.kv_held, a.kv_shared) == (100, 0) and (b.kv_held, b.kv_shared, b.lender) == (68, 32, "a")
    assert after.free == 1000 - 200 + 32 and total_kv(after) == total_kv(s)
    done, _ = apply_decision(replace(after, running=[replace(a, target_output=1), b]), Decision(admitted=[]),
                             page_size=1, radix_cache=True, prefix_block=16)
    (heir,) = done.running  # a finished: b holds the shared pages now (hand_over)
    assert (heir.kv_held, heir.kv_shared, heir.lender) == (101, 0, None)
    plain, _ = apply_decision(s, admitted, page_size=1, radix_cache=True)  # a trace without ids
    assert plain.free == 800 and all(r.kv_shared == 0 for r in plain.running)


def test_on_the_mamba_pool_too_a_siblings_prefix_is_freed_when_it_lands():
    """The hybrid tree frees the same duplicates on insert: a mamba-priority recording's available KV
    came back by the shared 600 tokens one pass after two family members prefilled together."""
    from schedtrace.replay.loop.pools import LoopPools

    shared, a_own, b_own = bytes(8) * 2, b"A" * 8 * 5, b"B" * 8 * 5
    s = state(waiting=[_family("a", shared, a_own), _family("b", shared, b_own)], mamba_free=8, mamba_evictable=0)
    after, _ = apply_decision(s, Decision(admitted=[("a", 100), ("b", 100)]), page_size=1, radix_cache=True,
                              prefix_block=16, pools=LoopPools(mamba_slots_per_req=1))
    a, b = after.running
    assert (b.kv_held, b.kv_shared, b.lender) == (68, 32, "a") and after.free == 1000 - 200 + 32
    assert after.mamba_free == 6 and (a.mamba_held, b.mamba_held) == (1, 1)
    assert after.pool_totals() == s.pool_totals()


def test_overlap_a_chunk_lands_at_the_next_pass_entry_before_that_pass_decides():
    """The next pass stashes the chunked request first (stash_chunked_request): its chunk is in the
    tree when that pass's results land, overlap or not (the dfs-weight trace: a sibling's prefill
    found it there)."""
    s = state(waiting=[waiting("c", 300, target=50)])
    s1, _ = overlap_step(s, Decision(admitted=[("c", 100)], new_chunked_rid="c"))
    assert (s1.chunked.tree_len, s1.chunked.tree_landing) == (100, 0)


def test_overlap_a_prefill_reaches_the_tree_a_step_later():
    s = state(waiting=[waiting("b", 100, target=50)])
    s1, _ = overlap_step(s, Decision(admitted=[("b", 100)]))
    s2, _ = overlap_step(s1, Decision(admitted=[]))
    assert (s1.running[0].tree_len, s2.running[0].tree_len) == (0, 100)


@pytest.mark.parametrize("by_abort", [False, True])
def test_overlap_a_client_aborted_request_decodes_once_more_before_it_leaves(by_abort: bool):
    """Under overlap a request whose last output is in flight finishes when that result is
    processed. By length, update_running_batch skips it: the step runs no forward. A client's
    abort is only seen then too: it decodes once more (the output is dropped), which counts a
    forward (the retraction hook's clock), then it leaves (a dfs-weight recording: pass 736)."""
    done = replace(running("a", output_len=10, target=10), inflight=1, ends_by_abort=by_abort)
    s = state(running=[done], forward_ct=7)
    after, result = apply_decision(s, Decision(admitted=[]), page_size=1, radix_cache=True, overlap=True)
    assert result.finished == ["a"] and after.running == []
    assert after.forward_ct == (8 if by_abort else 7)
    assert after.free + after.evictable == 1000 + done.kv_held  # its decode token given back with it


def test_idle_records_mark_the_clock_only_where_events_follow_them() -> None:
    """A decode tail past the last pass record: each idle count the recorder writes before an event is a
    clock point at the latest event of that pass (the requests finishing together stay together); a count
    written before a pass record, or at close, is none."""
    from schedtrace.replay.loop.clock import IdleMarks
    from schedtrace.testing.builders import pass_record
    from schedtrace.tracer.contract.schema import Alloc, Clock, Finish, Idle

    marks = IdleMarks()
    stream = [(pass_record(0, t_ns=100), None), (Idle(150, 3), 4),  # before a pass record: no point
              (pass_record(1, t_ns=160), None), (Idle(200, 1), 6), (Finish(200, "a", 5, "length"), None),
              (Clock(250, 9), None), (Finish(260, "b", 5, "length"), None),  # one pass, whatever the clock says
              (Idle(300, 1), 7), (Alloc(310, 1, "alloc_decode", 1, 10, 0, True), None),
              (Idle(9_000, 8), 15)]  # at close
    for record, next_pass in stream:
        marks.see(record)
        if next_pass is not None:
            marks.idle(next_pass, record.t_ns)
    assert marks.points == [(5, 199), (6, 260), (6, 309), (7, 310)]
    clock = PassClock(sorted([(0, 100), (4, 160)] + marks.points))
    assert clock.iteration_at(200) == clock.iteration_at(260) == 6  # a and b finished in pass 5: pass 6 is next
    assert clock.iteration_at(310) == 7
