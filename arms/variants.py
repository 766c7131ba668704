"""Variant names (``stock``, ``fixed``, fix names) and turning fixes on and off.

``applied(variant)`` sets exactly the variant's fixes for the duration of a
``with`` block and restores the previous set on exit, so blocks nest and
alternate freely. Every fix is checked and compiled once per process;
switching afterwards only assigns ``__code__`` attributes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from schedtrace.arms.fixes import FIX_NAMES, FIXES
from schedtrace.arms.patching import EditStatus, PreparedFix, prepare, sglang_version
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import FIXED, FIXES_ENV, STOCK

logger = logging.getLogger(__name__)

VARIANT_NAMES: tuple[str, ...] = (STOCK, FIXED, *FIX_NAMES)

_prepared: dict[str, PreparedFix] = {}
_active: frozenset[str] = frozenset()


@lru_cache(maxsize=64)
def parse_variant(variant: str) -> frozenset[str]:
    """Fix names a variant means: ``stock``, ``fixed``, a fix name or a comma list."""
    names = [part.strip() for part in variant.split(",") if part.strip()]
    if not names:
        raise UsageError(f"empty variant; valid names: {', '.join(VARIANT_NAMES)}")
    fixes: set[str] = set()
    for name in names:
        if name == STOCK:
            continue
        if name == FIXED:
            fixes.update(FIX_NAMES)
        elif name in FIXES:
            fixes.add(name)
        else:
            raise UsageError(
                f"unknown variant or fix {name!r}; valid names: {', '.join(VARIANT_NAMES)}"
            )
    return frozenset(fixes)


def variant_label(fixes: frozenset[str]) -> str:
    """Canonical name of a fix set: ``stock``, ``fixed`` or the fixes in order."""
    if not fixes:
        return STOCK
    if fixes == frozenset(FIX_NAMES):
        return FIXED
    return ",".join(name for name in FIX_NAMES if name in fixes)


def prepared(fix: str) -> PreparedFix:
    """The checked, compiled edits of ``fix`` (done once per process)."""
    edits = _prepared.get(fix)
    if edits is None:
        edits = _prepared[fix] = prepare(FIXES[fix])
        if edits.status is EditStatus.ALREADY_PRESENT:
            logger.warning(
                "fix %r already present in %s (sglang %s); nothing to patch",
                fix,
                ", ".join(edits.targets),
                sglang_version(),
            )
    return edits


def active_fixes() -> frozenset[str]:
    return _active


def set_active(fixes: frozenset[str]) -> dict[str, EditStatus]:
    """Make exactly ``fixes`` active; returns each requested fix's status."""
    global _active
    fixes = frozenset(fixes)
    statuses = {fix: prepared(fix).status for fix in FIX_NAMES if fix in fixes}
    for fix in fixes ^ _active:  # only what changes; a fix's edits go together
        edits = prepared(fix)
        edits.apply() if fix in fixes else edits.revert()
    _active = fixes
    return statuses


@contextmanager
def applied(variant: str) -> Iterator[frozenset[str]]:
    """Run the block with exactly ``variant``'s fixes, then restore the previous set."""
    fixes = parse_variant(variant)
    previous = _active
    set_active(fixes)
    try:
        yield fixes
    finally:
        set_active(previous)


def install_fixes_from_env(environ: dict[str, str] | None = None) -> dict[str, EditStatus]:
    """Apply ``$SCHEDTRACE_FIXES`` (``all`` or a comma list) for the rest of the process.

    For live servers: called from the sglang plugin ``register()`` in every
    sglang process. Unset or empty does nothing.
    """
    value = (os.environ if environ is None else environ).get(FIXES_ENV, "").strip()
    if not value:
        return {}
    fixes = parse_variant(FIXED if value == "all" else value)
    statuses = set_active(_active | fixes)
    if statuses:
        logger.warning(
            "schedtrace: %s=%s: %s (sglang %s, pid %d)",
            FIXES_ENV,
            value,
            ", ".join(f"{fix} {status.value.replace('patchable', 'applied')}" for fix, status in statuses.items()),
            sglang_version(),
            os.getpid(),
        )
    return statuses
