"""Closed loop: stock sglang stalls the waiting queue; the latch fix removes the stall.

Found by schedtrace in loop-latch.trace: an open-loop stock stall from pass 0 to 9 (10
passes, head request queued); `schedtrace bisect` names latch as the smallest set of
fixes that removes it. Delta debugging over the requests of its closed loop (6 requests,
10 passes → 2 requests, 1 pass) kept queued, run-0: test_loop_latch_stall0.trace beside
this file, which still stalls under stock and does not under latch, every step checked
by running both closed loops.

This test imports schedtrace: its closed-loop replay evolves the scheduler state pass by
pass, and the real sglang scheduler code decides every pass. It runs under the fixes
SCHEDTRACE_FIXES applied (schedtrace's pytest plugin). Fails on sglang 0.5.23 as
released; passes with `SCHEDTRACE_FIXES=latch python -m pytest`. Runs on CPU.
"""

from __future__ import annotations

from pathlib import Path

from schedtrace.replay.loop.run import run_closed_loop
from schedtrace.arms.variants import active_fixes, variant_label

TRACE = Path(__file__).with_name("test_loop_latch_stall0.trace")
STALL_PASSES = 8  # a stall: this many passes admitting nothing while the head fits


def test_waiting_queue_does_not_stall_in_closed_loop():
    """Every pass decided by the real scheduler, each arm living with its own decisions."""
    arm = variant_label(active_fixes())  # stock, or the fixes SCHEDTRACE_FIXES applied
    outcome = run_closed_loop(TRACE, [arm], stall_passes=STALL_PASSES).arms[arm]
    assert not outcome.stall_runs, (
        f"under {arm} the queue stalled: {outcome.stall_runs}; "
        "requests wait with a slot free and the head fitting in free + evictable KV"
    )
