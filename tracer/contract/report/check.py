"""What ``schedtrace check --json`` writes: a change over a corpus, one row per trace."""

from __future__ import annotations

from typing import Final

import msgspec

CHECK_VERSION: Final = 1


class CheckRow(msgspec.Struct, kw_only=True):
    """One trace (one rank of one run) under the two arms."""

    trace: str
    passes: int
    changed: int  # passes (and aiter events) whose decision differs
    first_changed: int | None
    stalls_added: int
    stalls_removed: int
    errors_added: int  # passes the new arm raised on and the old did not
    wait_p50: tuple[int, int] | None = None  # (old, new), closed loop only
    wait_p90: tuple[int, int] | None = None


class CheckReport(msgspec.Struct, kw_only=True):
    version: int = CHECK_VERSION
    old: str
    new: str
    arms: dict[str, str]  # each user arm: what it is and what it changes
    fail_on: list[str]
    rows: list[CheckRow]
    total: CheckRow
    tripped: list[str]  # the traces that trip the gate
