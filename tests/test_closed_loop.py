"""Closed-loop replay on reproduction traces, with the real sglang code (PassDriver).

Each trace is built with the project's writer: a recorded starting state,
arrival events for requests still to come and finish events giving every
request's output length. The closed loop then lives with each arm's own
decisions from that state on.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from replay import closed_loop
from replay.closed_loop import PassClock, load_input, run_arms, run_closed_loop
from replay.report import ClosedLoop
from tracer.errors import UsageError
from tracer.format import TraceReader, write_trace
from tracer.schema import Arrival, ChunkedReq, Finish, KvSnapshot, RunningReq, WaitingReq

from repro_traces import header, make_pass

MS = 1_000_000
LATCH_PASSES = 10  # recorded latched passes (an open-loop stall of 10)
FIRST_RUNNING_FINISH = 40  # decode steps until a running request leaves and stock unlatches


def latch_reproduction(path: Path) -> Path:
    """batch_is_full latched over a running batch, KV and slots free, requests queued and arriving.

    Stock sglang keeps the latch until a running request finishes, FIRST_RUNNING_FINISH
    passes later; the latch fix re-evaluates it on the first pass.
    """
    running = [RunningReq(f"run-{k}", 3000, 100, 100 + FIRST_RUNNING_FINISH + 10 * k, True) for k in range(3)]
    queued = WaitingReq("queued", 2000, 0, 20, 0, None, True)
    passes = [
        make_pass(
            n,
            t_ns=n * MS,
            running=[msgspec.structs.replace(r, output_len=r.output_len + n) for r in running],
            waiting=[queued],
            batch_is_full_in=True,
            kv=KvSnapshot(available=30000 - 3 * n, evictable=0),
            req_slots_free=10,
            batch_is_full_out=True,
        )
        for n in range(LATCH_PASSES)
    ]
    events = [
        Arrival(t_ns=0, rid="queued", input_len=2000, max_new_tokens=20, ignore_eos=True),
        Arrival(t_ns=5 * MS, rid="late-0", input_len=1500, max_new_tokens=10, ignore_eos=True),
        Arrival(t_ns=15 * MS, rid="late-1", input_len=2500, max_new_tokens=10, ignore_eos=True),
    ]
    finishes = [Finish(t_ns=500 * MS, rid=r.rid, output_len=r.max_new_tokens, reason="length") for r in running]
    finishes += [
        Finish(t_ns=600 * MS, rid="queued", output_len=20, reason="length"),
        Finish(t_ns=600 * MS, rid="late-0", output_len=10, reason="length"),
        Finish(t_ns=600 * MS, rid="late-1", output_len=10, reason="length"),
    ]
    return write_trace(path, header(), [events[0], *passes[:5], events[1], *passes[5:], events[2], *finishes])


def one_chunk_reproduction(path: Path) -> Path:
    """Default policy, a chunked request in flight, a second long request queued.

    With 1000-token chunks on a 64-token kernel grid, the continuing chunk is cut
    to 960 and leaves 40 tokens of chunk budget, which the stock adder gives to
    the second request as a new unfinished chunk: the scheduler's one-chunk assert.
    """
    hdr = header()
    hdr = msgspec.structs.replace(hdr, server_args=msgspec.structs.replace(hdr.server_args, chunked_prefill_size=1000))
    p = make_pass(
        0,
        running=[RunningReq(f"run-{k}", 500, 10, 30, True) for k in range(2)],
        waiting=[WaitingReq("second", 3000, 0, 10, 0, None, True)],
        chunked=ChunkedReq("first", 3000, 1000, 10, 0, True),
        kv=KvSnapshot(available=30000, evictable=0),
        req_slots_free=9,
        chunked_prefill_size=1000,
    )
    events = [
        Arrival(t_ns=-1, rid="second", input_len=3000, max_new_tokens=10, ignore_eos=True),
        Arrival(t_ns=3 * MS, rid="third", input_len=800, max_new_tokens=10, ignore_eos=True),
        Finish(t_ns=90 * MS, rid="run-0", output_len=30, reason="length"),
        Finish(t_ns=90 * MS, rid="run-1", output_len=30, reason="length"),
        Finish(t_ns=90 * MS, rid="first", output_len=10, reason="length"),
        Finish(t_ns=90 * MS, rid="second", output_len=10, reason="length"),
        Finish(t_ns=90 * MS, rid="third", output_len=10, reason="length"),
    ]
    later = make_pass(1, t_ns=10 * MS, running=p.running, kv=p.kv, req_slots_free=9, chunked_prefill_size=1000)
    return write_trace(path, hdr, [p, *events[:2], later, *events[2:]])


@pytest.fixture
def mamba_chunk_grid(monkeypatch):
    """The DCP mamba checkpoint grid the PR's hybrid model runs with (64 tokens).

    DCP needs several ranks, so only sglang's predicate is forced; the chunk
    cut itself is the real ``PrefillAdder.floor_chunked_tokens``.
    """
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "mamba_prefill_chunk_grid", lambda: 64)


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


def test_one_chunk_stock_raises_the_assert_and_fixed_completes(tmp_path, mamba_chunk_grid):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    runs = run_arms(trace, ["stock", "fixed", "one-chunk"])
    stock = runs["stock"].outcome
    assert stock.exceptions > 0
    assert stock.errors[0].pass_ == 0 and stock.errors[0].error.startswith("AssertionError")
    # Every pass that raised admitted nothing: the chunked request never moves on.
    assert stock.unfinished > 0 and stock.completed == 2  # only the running requests finish
    assert stock.stuck_at is not None
    for arm in ("fixed", "one-chunk"):
        outcome = runs[arm].outcome
        assert outcome.exceptions == 0 and outcome.over_asks == 0
        assert outcome.completed == 5 and outcome.unfinished == 0
    # The fixed arm cuts the continuation on the kernel grid and leaves the second request queued.
    first = runs["fixed"].decisions[0]
    assert first.admitted == [("first", 960)] and first.new_chunked_rid is None


def test_without_the_grid_cut_stock_does_not_raise(tmp_path):
    """Control: the same state on a plain budget never reaches the assert."""
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    stock = run_closed_loop(trace, ["stock"]).arms["stock"]
    assert stock.exceptions == 0 and stock.completed == 5


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


def test_closed_loop_module_exposes_the_replay_entry_point():
    assert callable(closed_loop.run_closed_loop)
