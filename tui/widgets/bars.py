"""The two text bars above the timeline: the trace header and the status line."""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text
from textual.reactive import var
from textual.widgets import Static

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tui.model.header import header_lines
from schedtrace.tui.model.scan import ScanResult

ALARMS = ("TRUNCATED", "unclosed")  # header labels shown in red


class TraceHeader(Static):
    """The trace's facts, and the replay's arms and divergence count; the app binds the reactives."""

    passes: var[int] = var(0, init=False)
    scan: var[ScanResult | None] = var(None, init=False)
    divergences: var[int] = var(0, init=False)

    def __init__(self, reader: TraceReader, arms: tuple[str, str] | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reader = reader
        self.arms = arms

    def watch_passes(self) -> None:
        self.update(self.text())

    def watch_scan(self) -> None:
        self.update(self.text())

    def watch_divergences(self) -> None:
        self.update(self.text())

    def text(self) -> Text:
        scan, reader = self.scan, self.reader
        pairs = header_lines(
            reader.header,
            pass_count=self.passes,
            duration_ns=scan.end_ns if scan else None,
            losses=scan.losses if scan else 0,
            truncated_at=(scan.truncated_at if scan else None) or reader.truncated_at,
            closed_cleanly=reader.closed_cleanly,
        )
        text = Text()
        for label, value in pairs:
            alarm = label in ALARMS or (label == "lost" and value != "0")
            text.append(f"{label} ", style="dim")
            text.append(value, style="bold red" if alarm else "bold")
            text.append("  ")
        if self.arms is not None:
            text.append("replay ", style="dim")
            text.append(f"{self.arms[0]} → {self.arms[1]}", style="bold")
            text.append(f"  {self.divergences:,} divergences", style="bold magenta")
        return text


class Status(NamedTuple):
    text: str = ""
    error: bool = False


class StatusLine(Static):
    """One line: what the app is doing, or what went wrong (in red)."""

    status: var[Status] = var(Status(), init=False)

    def watch_status(self, status: Status) -> None:
        self.update(Text(status.text, style="bold red" if status.error else "italic"))
