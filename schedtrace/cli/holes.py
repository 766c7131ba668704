"""The holes of a trace as ``info``, ``replay`` and ``bisect`` print them: one line per hole.

The holes themselves are ``tracer.analysis.holes`` (``Holes`` in a report);
this module only words them, the same way in every command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from schedtrace.cli.style import plural
from schedtrace.tracer.analysis.holes import holes_text
from schedtrace.tracer.contract.names import (LOSS_PASS_TOO_LARGE, LOSS_PAUSED, LOSS_QUEUE_FULL, LOSS_RING,
                                              LOSS_WRITE_ERROR)
from schedtrace.tracer.contract.report import DamagedRegion, Holes, LostRecords

if TYPE_CHECKING:
    from rich.console import Console

LOSS_WORDS = {
    LOSS_QUEUE_FULL: "writer queue full",
    LOSS_WRITE_ERROR: "a write failed",
    LOSS_RING: "fell off the ring",
    LOSS_PAUSED: "recording paused",
    LOSS_PASS_TOO_LARGE: "a pass too large to write",
}


def _passes(first: int | None, last: int | None) -> str:
    if first is None or last is None:
        return "no pass missing"
    return f"pass {first} missing" if first == last else f"passes {first}–{last} missing"


def region_line(region: DamagedRegion) -> str:
    """``4,654 bytes unreadable at offset 43425–48079, 60 records lost, passes 211–246 missing (why)``."""
    lost = "records lost: unknown" if region.records_lost is None else f"{region.records_lost:,} records lost"
    return (f"{region.end - region.start:,} bytes unreadable at offset {region.start}–{region.end}, {lost}, "
            f"{_passes(region.first_pass, region.last_pass)} ({region.reason})")


def loss_line(loss: LostRecords) -> str:
    """``578 records lost after pass 120 (queue_full: writer queue full)``."""
    where = "before the first pass" if loss.after_pass is None else f"after pass {loss.after_pass}"
    why = LOSS_WORDS.get(loss.reason)
    reason = loss.reason if why is None else f"{loss.reason}: {why}"
    return f"{loss.count:,} records lost {where} ({reason}; loss record at offset {loss.offset})"


def hole_lines(holes: Holes) -> list[str]:
    """One line per hole listed, in file order within each kind, and one for those not listed."""
    lines = [region_line(r) for r in holes.regions]
    if holes.region_count > len(holes.regions):
        lines.append(f"... {plural(holes.region_count - len(holes.regions), 'more unreadable region')}")
    lines += [loss_line(loss) for loss in holes.losses]
    if holes.loss_count > len(holes.losses):
        lines.append(f"... {plural(holes.loss_count - len(holes.losses), 'more loss record')}")
    return lines


def print_holes(holes: Holes, console: Console, *, title: bool = True) -> None:
    """The holes, one line each, never wrapped, under a title (``title=False``: a report's warning
    says it already); nothing for a trace without any."""
    if not holes.count:
        return
    if title:
        console.print(f"[yellow]holes:[/] {escape(holes_text(holes))}", soft_wrap=True, highlight=False)
    for line in hole_lines(holes):
        console.print(f"  {escape(line)}", soft_wrap=True, highlight=False)
