"""Variant names (``stock``, ``fixed``, fix names, user arm files) and turning them on and off.

A variant is a comma list of ``stock``, ``fixed``, fix names and user arms:
a path to a unified diff or an edits module (``schedtrace.arms.user``), or
the label ``FILE@HASH`` a loaded one is named by. ``parse_variant`` gives
the set of members (fix names and user arm labels); ``canonical_variant``
spells a variant with its files' labels, which is how reports name it.

``applied(variant)`` sets exactly the variant's members for the duration of a
``with`` block and restores the previous set on exit, so blocks nest and
alternate freely. Every member is checked and compiled once per process;
switching afterwards only assigns attributes (``__code__``, and a user arm's
module and class bindings).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from schedtrace.arms import user
from schedtrace.arms.fixes import FIX_NAMES, FIXES
from schedtrace.arms.patching import EditStatus, PreparedFix, prepare, sglang_version
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import FIXED, FIXES_ENV, STOCK

logger = logging.getLogger(__name__)

VARIANT_NAMES: tuple[str, ...] = (STOCK, FIXED, *FIX_NAMES)
_HINT = f"valid names: {', '.join(VARIANT_NAMES)}, or the path of a .diff/.patch or an edits .py"

_prepared: dict[str, PreparedFix | user.PreparedArm] = {}
_active: frozenset[str] = frozenset()


def _tokens(variant: str) -> list[str]:
    names = [part.strip() for part in variant.split(",") if part.strip()]
    if not names:
        raise UsageError(f"empty variant; {_HINT}")
    return names


def _member(name: str) -> str | None:
    """A token's member: a fix name, a user arm's label, None for stock; ``fixed`` is expanded by the caller."""
    if name == STOCK:
        return None
    if name in FIXES:
        return name
    if user.is_label(name):
        user.lookup(name)
        return name
    if user.is_arm_path(name):
        return user.load(name)
    raise UsageError(f"unknown variant or fix {name!r}; {_HINT}")


def targets_of(member: str) -> tuple[str, ...]:
    """The functions and names a member changes, ``module:Qual.name``."""
    if member in FIXES:
        return tuple(edit.target for edit in FIXES[member].edits)
    return user.lookup(member).targets


def _check_disjoint(members: set[str]) -> None:
    owner: dict[str, str] = {}
    for member in sorted(members):
        for target in targets_of(member):
            if target in owner and owner[target] != member:
                raise UsageError(f"{owner[target]} and {member} both change {target}; "
                                 "an arm can hold one change of it: combine them into one diff")
            owner[target] = member


@lru_cache(maxsize=64)
def parse_variant(variant: str) -> frozenset[str]:
    """Members a variant means: fix names and user arm labels (``stock``: none; ``fixed``: the four)."""
    members: set[str] = set()
    for name in _tokens(variant):
        if name == FIXED:
            members.update(FIX_NAMES)
        elif (member := _member(name)) is not None:
            members.add(member)
    if any(m not in FIXES for m in members):
        _check_disjoint(members)
    return frozenset(members)


def canonical_variant(variant: str) -> str:
    """``variant`` with each arm file named by its label (``latch,./mine.diff`` -> ``latch,mine.diff@1a2b...``)."""
    parse_variant(variant)  # every token checked, every file loaded
    return ",".join(user.load(t) if user.is_arm_path(t) and not user.is_label(t) else t for t in _tokens(variant))


def absolute_variant(variant: str) -> str:
    """``variant`` with each arm file as an absolute path, for a process started elsewhere (a server)."""
    parse_variant(variant)
    return ",".join(str(Path(t).resolve()) if user.is_arm_path(t) and not user.is_label(t) else t
                    for t in _tokens(variant))


def user_members(fixes: frozenset[str]) -> list[str]:
    return sorted(m for m in fixes if m not in FIXES)


def variant_label(fixes: frozenset[str]) -> str:
    """Canonical name of a member set: ``stock``, ``fixed`` or the fixes in order, then user arms' labels."""
    if not fixes:
        return STOCK
    builtins = [name for name in FIX_NAMES if name in fixes]
    head = [FIXED] if len(builtins) == len(FIX_NAMES) else builtins
    return ",".join([*head, *user_members(fixes)])


def prepared(fix: str) -> PreparedFix | user.PreparedArm:
    """The checked, compiled edits of ``fix`` (a fix name or a user arm label; done once per process).

    Prepared with nothing active, so what it keeps as the original is stock sglang's."""
    edits = _prepared.get(fix)
    if edits is None:
        active = _active
        set_active(frozenset())
        try:
            edits = prepare(FIXES[fix]) if fix in FIXES else user.prepare(fix)
        finally:
            set_active(active)
        _prepared[fix] = edits
        if edits.status is EditStatus.ALREADY_PRESENT:
            logger.warning(
                "arm %r already present in %s (sglang %s); nothing to patch",
                fix,
                ", ".join(edits.targets) or "the installed files",
                sglang_version(),
            )
    return edits


def active_fixes() -> frozenset[str]:
    return _active


def set_active(fixes: frozenset[str]) -> dict[str, EditStatus]:
    """Make exactly ``fixes`` active; returns each requested member's status (fixes in order, then user arms)."""
    global _active
    fixes = frozenset(fixes)
    order = [*(f for f in FIX_NAMES if f in fixes), *user_members(fixes)]
    statuses = {fix: prepared(fix).status for fix in order}
    # What leaves goes first: two arms (never one) may change one function or name.
    for fix in _active - fixes:
        _prepared[fix].revert()
    _active = _active & fixes
    for fix in fixes - _active:
        prepared(fix).apply()
    _active = fixes
    return statuses


@contextmanager
def applied(variant: str) -> Iterator[frozenset[str]]:
    """Run the block with exactly ``variant``'s members, then restore the previous set."""
    fixes = parse_variant(variant)
    previous = _active
    set_active(fixes)
    try:
        yield fixes
    finally:
        set_active(previous)


def install_fixes_from_env(environ: dict[str, str] | None = None) -> dict[str, EditStatus]:
    """Apply ``$SCHEDTRACE_FIXES`` (``all``, or a comma list of fixes and arm files) for the rest of the process.

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
