"""Closed-loop replay on reproduction traces (tests/loop_traces.py), with the
real sglang code (PassDriver): each arm lives with its own decisions from the
recorded state on."""

from __future__ import annotations

import msgspec
import pytest

from pathlib import Path

from schedtrace.replay.loop.run import PassClock, load_input, run_arms, run_closed_loop, scan_trace
from schedtrace.tracer.contract.report import ClosedLoop
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Arrival, Candidate, Finish, Idle, KvSnapshot, RunningReq, WaitingReq

from loop_traces import (
    FIRST_RUNNING_FINISH,
    MS,
    latch_reproduction,
    one_chunk_reproduction,
)
from repro_traces import header, make_pass

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------- latch


def test_latch_stalls_under_stock_and_not_under_fixed_or_latch_alone(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    result = run_closed_loop(trace, ["stock", "fixed", "latch"])
    assert isinstance(result, ClosedLoop) and result.from_pass == 0
    stock, fixed, latch = (result.arms[a] for a in ("stock", "fixed", "latch"))

    assert stock.stalls == 1
    (stall,) = stock.stall_runs
    assert stall.start_pass == 0 and stall.head_rid == "queued"
    # Stock admits only once the first running request finishes and clears the latch.
    assert stall.passes == FIRST_RUNNING_FINISH
    assert stock.first_admission_passes["queued"] == FIRST_RUNNING_FINISH
    for arm in (fixed, latch):
        assert arm.stalls == 0 and arm.stalled_passes == 0
        assert arm.first_admission_passes["queued"] == 0
        assert arm.first_admission_passes["late-0"] == 0  # admitted on arrival
    # Everyone gets served eventually: the latch delays, it does not lose work.
    for arm in (stock, fixed, latch):
        assert arm.completed == 6 and arm.unfinished == 0
        assert arm.exceptions == 0 and arm.over_asks == 0 and arm.stuck_at is None
    assert stock.queue_peak == 3 and fixed.queue_peak == 1
    assert stock.first_admission_passes["late-1"] > fixed.first_admission_passes["late-1"]



def test_what_happens_between_records_lands_on_the_next_record():
    """An arrival inside an idle stretch is first seen by the next pass record, not by the pass the
    clock interpolates there; a clock that runs backwards (an untrusted trace) is clamped first."""
    clock = PassClock([(0, 0), (1000, 10 * MS), (1001, 11 * MS), (1002, 5 * MS)])
    assert clock.iteration_at(5 * MS) == 500 and clock.record_after(5 * MS) == 1000
    assert clock.record_after(10 * MS) == 1000 and clock.record_after(10 * MS + 1) == 1001
    assert clock.times[-1] == 11 * MS  # the last record's 5 ms, clamped to the one before
    assert clock.record_after(20 * MS) == clock.iteration_at(20 * MS) > 1002  # past the last: the estimate

def test_arrivals_land_on_the_recorded_pass_clock(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    with TraceReader(trace) as reader:
        loop = load_input(reader, 0)
    assert [(step, r.rid) for step, r in loop.arrivals] == [(5, "late-0"), (15, "late-1")]
    assert {r.rid: r.target_output for r in loop.initial.running} == {"run-0": 140, "run-1": 150, "run-2": 160}
    assert loop.clock.period_ns == MS


def test_from_a_later_pass(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    result = run_closed_loop(trace, ["stock"], from_pass=6)
    (stall,) = result.arms["stock"].stall_runs
    assert stall.start_pass == 6 and stall.passes == FIRST_RUNNING_FINISH - 6
    with TraceReader(trace) as reader:
        loop = load_input(reader, 6)
    assert [(step, r.rid) for step, r in loop.arrivals] == [(9, "late-1")]  # late-0 already came


def test_closed_loop_is_deterministic(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    first = msgspec.json.encode(run_closed_loop(trace, ["stock", "fixed"]), order="sorted")
    second = msgspec.json.encode(run_closed_loop(trace, ["stock", "fixed"]), order="sorted")
    assert first == second


def test_max_passes_bounds_the_loop(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    result = run_closed_loop(trace, ["stock"], max_passes=12)
    stock = result.arms["stock"]
    assert result.passes == 12 and stock.passes == 12
    assert stock.completed == 0 and stock.unfinished == 6
    assert stock.stall_runs[0].passes == 12  # the still-open stall is counted up to the bound


def test_bad_from_pass_is_a_usage_error(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    with pytest.raises(UsageError, match="--from 99"):
        run_closed_loop(trace, ["stock"], from_pass=99)


# --------------------------------------------------------------- one-chunk


def test_one_chunk_stock_raises_the_assert_every_pass_and_never_finishes(tmp_path):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    runs = run_arms(trace, ["stock"])
    stock = runs["stock"].outcome
    assert stock.exceptions > 0
    assert stock.errors[0].pass_ == 0 and stock.errors[0].error.startswith("AssertionError")
    assert runs["stock"].decisions[0].admitted == [("first", 960), ("second", 40)]  # two unfinished chunks
    # Every pass that raised admitted nothing: the chunked request never moves on,
    # only the two running requests finish, and the loop ends deadlocked.
    assert stock.completed == 2 and stock.unfinished == 3
    assert stock.stuck_at is not None
    assert stock.stalls == 1 and stock.stall_runs[0].head_rid == "second"


def test_a_stuck_arm_folds_the_passes_up_to_the_next_arrival(tmp_path):
    # The clock has 10 ms passes: the late request comes 1000 passes in.
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace", late_arrival_ns=10_000 * MS)
    run = run_arms(trace, ["stock"])["stock"]
    stock = run.outcome
    assert stock.passes > 1000 and len(run.passes) < 100  # folded, not decided 1000 times
    folded = max(run.passes, key=lambda p: p.repeat)
    assert folded.repeat > 900 and folded.error.startswith("AssertionError")
    assert stock.exceptions == sum(p.repeat for p in run.passes)  # every pass raised
    assert stock.stall_runs[0].passes > 900
    assert stock.completed == 2 and stock.stuck_at is not None
    assert "late" not in stock.first_admission_passes  # queued behind the wedged chunk


@pytest.mark.parametrize("arm", ["fixed", "one-chunk"])
def test_one_chunk_fixed_never_asserts_and_completes_every_request(tmp_path, arm):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    run = run_arms(trace, [arm])[arm]
    outcome = run.outcome
    assert outcome.exceptions == 0 and outcome.stalls == 0
    assert outcome.completed == 5 and outcome.unfinished == 0 and outcome.stuck_at is None
    # The guard keeps "second" out while "first" is in flight, cut on the grid.
    assert run.decisions[0].admitted == [("first", 960)]


@pytest.mark.parametrize("arm", ["fixed", "one-chunk"])
def test_one_chunk_fixed_starts_one_chunk_in_the_pass_the_first_one_ends(tmp_path, arm):
    """Found by the closed loop: on the ignore_eos route the pass that finishes
    "first" used to start "second" (896 of 3000 tokens) and then "third" (24 of
    800, the cut falling back to the leftover) as new chunks; only "third" was
    tracked, so "second" ran on 896 tokens of its prompt. The fix keeps "third"
    out while "second" is this pass's new chunk."""
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    run = run_arms(trace, [arm])[arm]
    third_pass = run.decisions[2]
    assert third_pass.admitted == [("first", 80), ("second", 896)]
    assert third_pass.new_chunked_rid == "second" and third_pass.error is None
    assert run.outcome.truncated_prefills == 0


def test_one_chunk_fixed_runs_every_request_on_its_whole_prompt(tmp_path):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    assert run_closed_loop(trace, ["fixed"]).arms["fixed"].truncated_prefills == 0


def test_with_the_radix_cache_on_nothing_raises_and_all_complete(tmp_path):
    """Control: ``_select_prefill_admission`` floors the 40-token leftover to the grid."""
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace", radix_cache=True)
    runs = run_arms(trace, ["stock", "fixed"])
    for arm, run in runs.items():
        outcome = run.outcome
        assert outcome.exceptions == 0 and outcome.completed == 5 and outcome.unfinished == 0, arm
    first = runs["stock"].decisions[0]
    assert first.admitted == [("first", 960)] and first.new_chunked_rid is None


# ----------------------------------------------------------------- clock


def test_clock_from_folded_and_idle_passes(tmp_path):
    records = [
        make_pass(0, t_ns=0),
        make_pass(1, t_ns=10 * MS, idle_before=6, repeat=4),  # passes 6..9
        make_pass(2, t_ns=20 * MS, idle_before=0),  # pass 10
    ]
    path = write_trace(tmp_path / "clock.trace", header(), records)
    with TraceReader(path) as reader:
        loop = load_input(reader, 1)
    assert loop.start_iteration == 7
    assert loop.clock.iterations == [0, 7, 11]
    assert isinstance(loop.clock, PassClock)


def test_clock_counts_idle_records_once_like_the_recorder_writes_them(tmp_path):
    # The recorder writes idle passes as an idle record and, when a pass follows
    # directly, again in that pass's idle_before: the clock counts them once.
    records = [
        make_pass(0, t_ns=0),
        Idle(t_ns=9 * MS, count=5),
        make_pass(1, t_ns=10 * MS, idle_before=5),  # pass 6
        Idle(t_ns=15 * MS, count=3),
        make_pass(2, t_ns=20 * MS),  # pass 10
    ]
    path = write_trace(tmp_path / "clock.trace", header(), records)
    with TraceReader(path) as reader:
        loop = load_input(reader, 1)
    assert loop.clock.iterations == [0, 6, 10]
    assert loop.start_iteration == 6


def test_an_empty_server_skips_straight_to_the_next_arrival(tmp_path):
    start = make_pass(0, t_ns=0, kv=KvSnapshot(available=30000, evictable=0), req_slots_free=12)
    later = make_pass(1, t_ns=1000 * MS, kv=start.kv, req_slots_free=12)
    events = [
        Arrival(t_ns=500 * MS, rid="late", input_len=100, max_new_tokens=3, ignore_eos=True),
        Finish(t_ns=900 * MS, rid="late", output_len=3, reason="length"),
    ]
    path = write_trace(tmp_path / "gap.trace", header(), [start, events[0], later, events[1]])
    runs = run_arms(path, ["stock"])
    run = runs["stock"]
    # The clock: 2 passes 1 s apart, so the arrival lands half-way, on pass 1.
    assert run.outcome.completed == 1 and run.outcome.first_admission_passes == {"late": 0}
    assert [p.seq for p in run.passes] == [1]  # one pass record: the rest were idle


def test_the_report_holds_each_arms_own_run_and_the_longest_pass_count(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    runs = run_arms(trace, ["stock", "fixed"])
    report = run_closed_loop(trace, ["stock", "fixed"])
    assert report.arms == {arm: run.outcome for arm, run in runs.items()}
    assert report.passes == max(run.outcome.passes for run in runs.values())


# ----------------------------------------------------- inputs from the recording


def test_a_recorded_prefix_match_applies_from_the_pass_that_saw_it(tmp_path):
    """The latch holds "queued" until pass 40; the recording saw its 1500-token match
    (all of it evictable) at pass 5, so the real code admits only the other 500 tokens."""
    queued = WaitingReq("queued", 2000, 0, 20, 0, None, True)
    running = [RunningReq(f"run-{k}", 3000, 100, 140 + 10 * k, True) for k in range(3)]
    kv = KvSnapshot(available=30000, evictable=2000)

    def latched(n: int, **fields):
        return make_pass(n, t_ns=n * MS, waiting=[queued], batch_is_full_in=True, batch_is_full_out=True,
                         running=[msgspec.structs.replace(r, output_len=r.output_len + n) for r in running],
                         kv=kv, req_slots_free=10, **fields)

    seen = Candidate(rid="queued", prefix_len=1500, extend_len=0, result="OTHER", locked_evictable=1500)
    passes = [latched(n, candidates=[seen] if n == 5 else []) for n in range(10)]
    events = [Arrival(t_ns=0, rid="queued", input_len=2000, max_new_tokens=20, ignore_eos=True),
              *(Finish(t_ns=500 * MS, rid=r.rid, output_len=r.max_new_tokens, reason="length") for r in running),
              Finish(t_ns=600 * MS, rid="queued", output_len=20, reason="length")]
    trace = write_trace(tmp_path / "match.trace", header(), [events[0], *passes, *events[1:]])
    with TraceReader(trace) as reader:
        loop = load_input(reader, 0)
    assert loop.matches == [(5, "queued", 1500, 1500)] and loop.initial.waiting[0].prefix_len == 0
    run = run_arms(trace, ["stock"], loop=loop)["stock"]
    admitted = [d.admitted for d in run.decisions if d.admitted]
    assert admitted[0] == [("queued", 500)]
    assert run.passes[5].waiting[0].prefix_len == 1500 and run.passes[4].waiting[0].prefix_len == 0
    assert run.passes[5].candidates[0].locked_evictable == 1500  # what locking it takes, for the driver
    assert run.outcome.completed == 4 and run.outcome.first_admission_passes["queued"] == FIRST_RUNNING_FINISH



def test_a_match_follows_the_recording_as_it_grows_and_an_aborted_waiter_leaves(tmp_path):
    """The waiting rows show "queued"'s match grow (129, then 600: a shared prefix's chunks
    landing); "gone" is aborted while it waits, so the loop's queue loses it then too."""
    queued = WaitingReq("queued", 2000, 0, 20, 0, None, True)
    gone = WaitingReq("gone", 900, 0, 20, 0, None, True)
    running = [RunningReq(f"run-{k}", 3000, 100, 140 + 10 * k, True) for k in range(3)]
    kv = KvSnapshot(available=30000, evictable=2000)

    def latched(n: int):
        match = 0 if n < 3 else 129 if n < 6 else 600
        waiting = [msgspec.structs.replace(queued, prefix_len=match), *([gone] if n < 4 else [])]
        return make_pass(n, t_ns=n * MS, waiting=waiting, batch_is_full_in=True, batch_is_full_out=True,
                         running=[msgspec.structs.replace(r, output_len=r.output_len + n) for r in running],
                         kv=kv, req_slots_free=10)

    events = [Arrival(t_ns=0, rid="queued", input_len=2000, max_new_tokens=20, ignore_eos=True),
              Arrival(t_ns=0, rid="gone", input_len=900, max_new_tokens=20, ignore_eos=True)]
    ends = [Finish(t_ns=int(3.5 * MS), rid="gone", output_len=0, reason="abort"),
            *(Finish(t_ns=500 * MS, rid=r.rid, output_len=r.max_new_tokens, reason="length") for r in running),
            Finish(t_ns=600 * MS, rid="queued", output_len=20, reason="length")]
    trace = write_trace(tmp_path / "grow.trace", header(), [*events, *[latched(n) for n in range(10)], *ends])
    with TraceReader(trace) as reader:
        loop = load_input(reader, 0)
    assert [(step, prefix) for step, rid, prefix, _ in loop.matches] == [(3, 129), (6, 600)]
    assert loop.leaves == [(4, "gone")]  # the first pass after its abort
    run = run_arms(trace, ["stock"], loop=loop)["stock"]
    assert [len(p.waiting) for p in run.passes[:6]] == [2, 2, 2, 2, 1, 1]
    assert [p.waiting[0].prefix_len for p in run.passes[:8]] == [0, 0, 0, 129, 129, 129, 600, 600]
    assert run.finished_at["gone"] == 4 and "gone" not in run.outcome.first_admission_passes

def test_a_waiter_aborted_alone_leaves_at_the_idle_pass_that_took_the_abort(tmp_path):
    """With nothing else waiting, the pass that takes the abort is idle, so no pass record shows
    it: the request leaves right after the last record that showed it waiting (pass 4), not at
    the next pass record (pass 7), where a slot freed meanwhile would have let the loop admit it."""
    gone = WaitingReq("gone", 900, 0, 20, 0, None, True)
    running = [RunningReq("run", 3000, 100, 104, True)]
    kv = KvSnapshot(available=30000, evictable=0)
    latched = [make_pass(n, t_ns=n * MS, waiting=[gone], batch_is_full_in=True, batch_is_full_out=True,
                         running=[msgspec.structs.replace(running[0], output_len=100 + n)], kv=kv, req_slots_free=10)
               for n in range(4)]
    later = make_pass(4, t_ns=200 * MS, waiting=[WaitingReq("next", 100, 0, 4, 0, None, True)], kv=kv,
                      req_slots_free=10)
    records = [Arrival(t_ns=0, rid="gone", input_len=900, max_new_tokens=20, ignore_eos=True), *latched,
               Finish(t_ns=int(3.5 * MS), rid="gone", output_len=0, reason="abort"),
               Finish(t_ns=4 * MS, rid="run", output_len=104, reason="length"),
               Idle(t_ns=200 * MS, count=3),
               Arrival(t_ns=199 * MS, rid="next", input_len=100, max_new_tokens=4, ignore_eos=True), later,
               Finish(t_ns=300 * MS, rid="next", output_len=4, reason="length")]
    trace = write_trace(tmp_path / "alone.trace", header(), records)
    with TraceReader(trace) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, 0, scan)
    assert scan.clock.record_after(int(3.5 * MS)) == 7  # the next pass record: three idle passes later
    assert loop.leaves == [(4, "gone")]
    run = run_arms(trace, ["stock"], loop=loop)["stock"]
    assert run.finished_at["gone"] == 4 and "gone" not in run.outcome.first_admission_passes


def test_overlap_scheduling_is_read_from_the_recording(tmp_path):
    """A running request without its first output is one whose prefill result is not processed
    yet: only sglang's overlap loop shows that. The sample traces were recorded with it."""
    fresh = [RunningReq("new", 100, 0, 10, True)]
    for running, overlap in (([], False), ([RunningReq("old", 100, 3, 10, True)], False), (fresh, True)):
        trace = write_trace(tmp_path / "o.trace", header(), [make_pass(0), make_pass(1, running=running)])
        with TraceReader(trace) as reader:
            assert scan_trace(reader).overlap is overlap
            assert load_input(reader, 0).overlap is overlap
    with TraceReader(REPO / "traces" / "kv-pressure-fcfs.trace") as reader:
        assert scan_trace(reader).overlap is True
