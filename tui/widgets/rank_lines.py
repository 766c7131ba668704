"""The detail pane's lines about the other ranks and the file's damage: a desync's fields, the DP
ranks' queues side by side, the gaps and the recorder's losses at a pass."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from schedtrace.tracer.contract.report import DpCell, RankDiff
from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.marks import GLYPHS
from schedtrace.tui.model.scan import LossAt
from schedtrace.tui.widgets import palette
from schedtrace.tui.widgets.pass_detail import Cell, table_lines

MAX_VALUE = 60  # characters of one rank group's value shown


def desync_lines(diff: RankDiff, label: str) -> list[Text]:
    """Which ranks disagree at this pass, and each differing field with every group of ranks' value."""
    style = palette.MARK_STYLES["desync"]
    who = diff.odd if label not in diff.odd else [r for r in diff.passes if r != label and r not in diff.odd]
    side = ("this rank differs from " if label in diff.odd else "differing: ") + ", ".join(who)
    cause = "the inputs already differ" if diff.kind == "inputs" else "same inputs, another decision"
    lines = [Text(f"{GLYPHS['desync']} ranks disagree ({diff.group}): {side}; {cause}", style=style,
                  overflow="fold")]
    rows: list[list[Cell]] = []
    for field in diff.fields:
        for i, group in enumerate(field.values):
            value = str(group.value)
            value = value if len(value) <= MAX_VALUE else value[: MAX_VALUE - 1] + "…"
            mine = label in group.ranks
            rows.append([Text(field.field if i == 0 else "", style="bold yellow"), field.side if i == 0 else "",
                         Text(", ".join(group.ranks), style="bold" if mine else ""), value])
    lines.extend(table_lines("Differing fields", ["field", "side", "ranks", "value"], rows))
    return lines


def dp_lines(cells: Sequence[DpCell], label: str) -> list[Text]:
    """The DP ranks at this time (their own schedules: they legitimately differ)."""
    rows: list[list[Cell]] = [
        [Text(c.rank, style="bold" if c.rank == label else ""), f"{c.waiting_mean:g} (max {c.waiting_max})",
         f"{c.running_mean:g}", str(c.admitted), str(c.idle)] for c in cells]
    return table_lines("DP ranks in this time slice (each schedules its own requests)",
                       ["rank", "waiting", "running", "admitted", "idle passes"], rows)


def damage_lines(gaps: Sequence[GapView], losses: Sequence[LossAt]) -> list[Text]:
    """The gaps whose row this is, or that lost this pass, and the loss records after it."""
    lines = [Text(f"{GLYPHS['gap']} {gap.describe()} ({gap.reason})", style="bold red", overflow="fold")
             for gap in gaps]
    lines.extend(Text(f"{GLYPHS['loss']} the recorder dropped {loss.count:,} records after this pass "
                      f"({loss.reason})", style=palette.MARK_STYLES["loss"], overflow="fold") for loss in losses)
    return lines


def damage_report(gaps: Sequence[GapView], losses: Sequence[LossAt], total_lost: int, *, scanned: bool,
                  closed: bool) -> Text:
    """The ``i`` screen: every gap (bytes, records lost, the passes lost) and every loss record."""
    text = Text()
    text.append("Gaps (unreadable bytes; reading went on past each)\n", style="bold underline")
    if not gaps:
        text.append("  none: the file closed cleanly\n" if closed else "  none\n")
    for gap in gaps:
        text.append(f"  {GLYPHS['gap']} ", style=palette.MARK_STYLES["gap"])
        text.append(f"{gap.describe()}\n      {gap.reason}; its row: pass {gap.position}\n")
    text.append("\nLosses (records the recorder dropped)\n", style="bold underline")
    if not scanned:
        text.append("  still scanning the trace\n")
    elif not losses:
        text.append("  none\n")
    for loss in losses:
        text.append(f"  {GLYPHS['loss']} ", style=palette.MARK_STYLES["loss"])
        text.append(f"{loss.count:,} records after pass {loss.after} ({loss.reason})\n")
    if scanned and losses:
        text.append(f"  {total_lost:,} records lost in all\n", style="bold")
    text.append("\nx / X: the next / previous gap or loss.  escape closes this.\n", style="dim")
    return text
