"""Switching the arms on and off around one replayed pass, at the cost of the code swaps alone.

``PassDriver.decide`` switches twice per pass and arm; ``arms.variants.set_active``
re-checks every arm's status on each call, several times what the swaps cost.
"""

from __future__ import annotations

from collections.abc import Callable

from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.arms.variants import active_fixes, parse_variant, prepared, user_members
from schedtrace.tracer.contract.names import STOCK


def fixes_of(variant: str) -> frozenset[str]:
    """The fix set of ``variant`` (``schedtrace.arms.variants.parse_variant``, cached)."""
    return frozenset() if variant == STOCK else parse_variant(variant)


# (from, to) -> the code swaps that take the arms from one set to the other.
_SWITCHES: dict[tuple[frozenset[str], frozenset[str]], tuple[Callable[[], None], ...]] = {}


def _switch(active: frozenset[str], fixes: frozenset[str]) -> tuple[Callable[[], None], ...]:
    """``set_active``'s steps from ``active`` to ``fixes`` (leaving arms reverted first, then the
    arriving ones applied in its order), kept: set_active re-checks every arm's status on each
    call, several times what the code swaps cost, and decide switches twice per pass."""
    steps = _SWITCHES.get((active, fixes))
    if steps is None:
        arriving = [*(f for f in FIX_NAMES if f in fixes - active), *user_members(fixes - active)]
        steps = _SWITCHES[(active, fixes)] = (
            *(prepared(f).revert for f in sorted(active - fixes)), *(prepared(f).apply for f in arriving))
    return steps


def switch_fixes(fixes: frozenset[str]) -> frozenset[str]:
    """Make ``fixes`` active for one pass; returns the set that was active (give it to
    ``restore_fixes``). ``active_fixes()`` keeps answering the outer set meanwhile: only the
    pass's sglang code runs in between, under the driver's lock."""
    active = active_fixes()
    if active != fixes:
        for step in _switch(active, fixes):
            step()
    return active


def restore_fixes(fixes: frozenset[str], previous: frozenset[str]) -> None:
    if previous != fixes:
        for step in _switch(fixes, previous):
            step()
