"""The two text bars above the charts: the trace header and the status line."""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text
from textual.reactive import reactive, var
from textual.widget import Widget
from textual.widgets import Static

from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.header import SEPARATOR, HeaderItem, fit, header_items
from schedtrace.tui.model.rank_set import Reader
from schedtrace.tui.model.scan import ScanResult


class TraceHeader(Widget):
    """The trace's facts, the replay's arms and divergence count, and whether the report is this
    trace's, in one line (the least useful facts are left out when it is narrow: fitted when drawn)."""

    passes: reactive[int] = reactive(0, init=False)
    scan: reactive[ScanResult | None] = reactive(None, init=False)
    divergences: reactive[int] = reactive(0, init=False)
    report_doubts: reactive[list[str]] = reactive(list, init=False)
    gaps: reactive[list[GapView]] = reactive(list, init=False)
    ranks: reactive[tuple[str, bool] | None] = reactive(None, init=False)  # the ranks' verdict, and is it a desync

    def __init__(self, reader: Reader, arms: tuple[str, str] | None, rank: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.show(reader, arms, rank)

    def show(self, reader: Reader, arms: tuple[str, str] | None, rank: str | None) -> None:
        """The trace (the rank, ``tp1 2/4``) this header is about."""
        self.reader, self.arms, self.rank = reader, arms, rank
        self.refresh()

    def render(self) -> Text:
        return self.text()

    def items(self) -> list[HeaderItem]:
        scan, reader = self.scan, self.reader
        items = header_items(
            reader.header,
            pass_count=self.passes,
            duration_ns=scan.end_ns if scan else None,
            losses=scan.losses if scan else 0,
            truncated_at=(scan.truncated_at if scan else None) or reader.truncated_at,
            closed_cleanly=reader.closed_cleanly,
            rank=self.rank,
            gaps=self.gaps,
            ranks=self.ranks,
        )
        if self.arms is not None:
            items.append(HeaderItem("replay", f"{self.arms[0]} → {self.arms[1]}"))
            items.append(HeaderItem("", f"{self.divergences:,} divergences", accent=True))
        if self.report_doubts:
            items.append(HeaderItem("REPORT", "not of this trace?", alarm=True))
        return items

    def text(self) -> Text:
        width = self.content_size.width or self.app.size.width
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, item in enumerate(fit(self.items(), width)):
            if i:
                text.append(SEPARATOR)
            if item.label:
                text.append(f"{item.label} ", style="dim")
            text.append(item.value, style="bold red" if item.alarm else "bold magenta" if item.accent else "bold")
        return text


class Status(NamedTuple):
    text: str = ""
    error: bool = False


class StatusLine(Static):
    """One line: what the app is doing, or what went wrong (in red)."""

    status: var[Status] = var(Status(), init=False)

    def watch_status(self, status: Status) -> None:
        self.update(Text(status.text, style="bold red" if status.error else "italic"))
