"""The timeline: series max-downsampled to one bucket per column, sparklines and event marks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from schedtrace.tui.model.marks import GLYPHS, Marks
from schedtrace.tui.model.scan import SERIES, ScanResult


def downsample(values: Sequence[int], start: int, stop: int, buckets: int) -> list[int]:
    """Max of each of ``buckets`` equal slices of values[start:stop] (peaks must stay visible)."""
    stop = min(stop, len(values))
    span = stop - start
    if span <= 0 or buckets <= 0:
        return []
    if span <= buckets:
        return list(values[start:stop])
    out = []
    for b in range(buckets):
        lo = start + span * b // buckets
        hi = start + span * (b + 1) // buckets
        out.append(max(values[lo:max(hi, lo + 1)]))
    return out


def bucket_of(pass_no: int, start: int, stop: int, buckets: int) -> int:
    span = max(stop - start, 1)
    if span <= buckets:
        return pass_no - start
    return min((pass_no - start) * buckets // span, buckets - 1)


def pass_of_bucket(bucket: int, start: int, stop: int, buckets: int) -> int:
    span = max(stop - start, 1)
    if span <= buckets:
        return min(start + bucket, stop - 1)
    return min(start + span * bucket // buckets, stop - 1)


SPARK: Final = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[int], top: int | None = None) -> str:
    if not values:
        return ""
    top = max(values) if top is None else top
    if top <= 0:
        return SPARK[1] * len(values) if any(v < 0 for v in values) else " " * len(values)
    last = len(SPARK) - 1
    return "".join(SPARK[min(last, max(0, -(-v * last // top)))] for v in values)


def mark_buckets(marks: Marks, passes: int, buckets: int) -> str:
    """One character per timeline bucket; an error outranks a divergence, which outranks a stall."""
    cells = [" "] * buckets
    if passes <= 0:
        return "".join(cells)
    for start, end in marks.stall_ranges:
        for b in range(bucket_of(start, 0, passes, buckets), bucket_of(min(end, passes - 1), 0, passes, buckets) + 1):
            cells[b] = GLYPHS["stall"]
    for points, ch in ((marks.divergence, GLYPHS["divergence"]), (marks.error, GLYPHS["error"])):
        for n in points:
            if 0 <= n < passes:
                cells[bucket_of(n, 0, passes, buckets)] = ch
    return "".join(cells)


@dataclass
class TimelineData:
    passes: int
    buckets: int
    series: dict[str, list[int]]
    peaks: dict[str, int]
    marks: str  # one character per bucket: a GLYPHS character, or " " for nothing


def timeline_data(scan: ScanResult, marks: Marks, buckets: int) -> TimelineData:
    """Every series and the event marks, ``buckets`` columns wide (fewer if there are fewer passes)."""
    passes = scan.passes
    series = {name: downsample(scan.series[name], 0, passes, buckets) for name in SERIES}
    used = len(series[SERIES[0]])
    return TimelineData(
        passes=passes,
        buckets=used,
        series=series,
        peaks={name: max(values, default=0) for name, values in series.items()},
        marks=mark_buckets(marks, passes, used),
    )
