"""Where a trace is damaged: its gaps (unreadable bytes) as the browser lists and marks them.

A gap loses the passes whose records start inside it, and in v2 the delta
passes after it up to the next keyframe (``Gap.orphans``); the pass index
still numbers them (reader.py), so each gap has a place in the pass list.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from schedtrace.tracer.analysis.holes import damaged_region
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tui.model.rank_set import Reader


@dataclass(frozen=True)
class GapView:
    """One gap: bytes ``start``..``end`` of ``file``, and the pass numbers it loses."""

    file: str  # the file (the part) it is in, by name
    start: int
    end: int
    records_lost: int | None  # None: unknown (a v1 trace, or no later marker)
    first_lost: int  # the first pass number lost
    stop: int  # one past the last pass number lost (== first_lost: none lost)
    reason: str
    position: int  # its row in the pass list: the first pass lost, else the pass after it

    @property
    def passes_lost(self) -> int:
        return self.stop - self.first_lost

    def passes_text(self) -> str:
        if not self.passes_lost:
            return "no pass lost"
        if self.passes_lost == 1:
            return f"pass {self.first_lost} lost"
        return f"passes {self.first_lost}–{self.stop - 1} lost ({self.passes_lost:,})"

    def describe(self) -> str:
        records = "records lost: unknown" if self.records_lost is None else f"{self.records_lost:,} records lost"
        return f"gap in {self.file} at bytes {self.start:,}–{self.end:,}: {records}, {self.passes_text()}"


def gap_views(gaps: Sequence[Gap], offsets: Sequence[int], file: str, pass_base: int = 0) -> list[GapView]:
    """``gaps`` of one file whose pass index is ``offsets``; its pass 0 is the trace's ``pass_base``."""
    out = []
    last = pass_base + max(len(offsets) - 1, 0)
    for gap in gaps:
        region = damaged_region(gap, offsets, pass_base)  # the pass numbers it costs, as replay counts them
        at = pass_base + bisect_left(offsets, gap.start)
        first = region.first_pass if region.first_pass is not None else at
        out.append(GapView(file=file, start=gap.start, end=gap.end, records_lost=gap.lost, first_lost=first,
                           stop=first + region.passes_lost, reason=gap.reason, position=min(at, last)))
    return out


def reader_gaps(reader: Reader) -> list[GapView]:
    """Every gap of the trace ``reader`` reads, in order (a rank of several parts: each part checked)."""
    if isinstance(reader, TraceReader):
        return gap_views(reader.gaps, reader.pass_offsets, Path(reader.path).name)
    out: list[GapView] = []
    for part, gaps, offsets in reader.part_gaps():
        base = part.header.first_pass - reader.header.first_pass
        out.extend(gap_views(gaps, offsets, part.path.name, base))
    return out
