"""The driver's fast paths build what the slow ones build: the pass's batch, and the arms' code."""

from __future__ import annotations

from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.arms.variants import active_fixes, parse_variant, prepared
from schedtrace.replay.arm_switch import restore_fixes, switch_fixes
from schedtrace.replay.requests import batch_defaults
from sglang.srt.managers.schedule_batch import ScheduleBatch


def test_a_batch_from_the_defaults_is_the_one_init_builds() -> None:
    real = ScheduleBatch(reqs=["r"], batch_is_full=True)
    fast = ScheduleBatch.__new__(ScheduleBatch)
    fast.__dict__.update(batch_defaults(ScheduleBatch))
    fast.reqs, fast.batch_is_full = ["r"], True
    assert list(vars(fast).items()) == list(vars(real).items())


def test_switching_arms_for_a_pass_applies_them_and_restores_stock() -> None:
    assert active_fixes() == frozenset()
    fixed = parse_variant("fixed")
    previous = switch_fixes(fixed)
    try:
        assert all(prepared(f).is_applied for f in FIX_NAMES)
    finally:
        restore_fixes(fixed, previous)
    assert previous == frozenset() == active_fixes()
    assert not any(prepared(f).is_applied for f in FIX_NAMES)
    one = parse_variant("latch")  # from one set to another and back again
    previous = switch_fixes(one)
    assert [prepared(f).is_applied for f in FIX_NAMES] == [f == "latch" for f in FIX_NAMES]
    restore_fixes(one, previous)
    assert not any(prepared(f).is_applied for f in FIX_NAMES)
