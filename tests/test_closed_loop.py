"""Closed-loop replay on reproduction traces (tests/loop_traces.py), with the
real sglang code (PassDriver): each arm lives with its own decisions from the
recorded state on."""

from __future__ import annotations

import msgspec
import pytest

from replay import closed_loop
from replay.closed_loop import PassClock, load_input, run_arms, run_closed_loop
from replay.report import ClosedLoop
from tracer.errors import UsageError
from tracer.format import TraceReader, write_trace

from loop_traces import (  # noqa: F401 (mamba_chunk_grid is a fixture)
    FIRST_RUNNING_FINISH,
    MS,
    latch_reproduction,
    mamba_chunk_grid,
    one_chunk_reproduction,
)
from repro_traces import header, make_pass


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
