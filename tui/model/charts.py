"""The charts' data: the scan's per-pass series cut into equal slices of TIME, one per column.

Pass numbers are not time: a trace's first passes can span half a minute of
idling and its busy seconds thousands of passes. So each chart column is an
equal slice of the trace's time; a column with no pass holds the state the
pass before it left (nothing was recorded because nothing changed). At most
one point per column is drawn, whatever the trace's length.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import floor, log10

from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.analysis import admission as adm
from schedtrace.tracer.analysis.why import why
from schedtrace.tracer.contract.schema import Header, Pass
from schedtrace.tui.model.marks import GLYPHS, POINT_KINDS, Marks
from schedtrace.tui.model.scan import ScanResult

# Verdicts whose check compared the head's need with the KV budget (the others never got that far).
_NEED_VERDICTS = frozenset({adm.ADMITS, adm.NO_TOKEN, adm.ONE_CHUNK, adm.EMPTY_CUT})


@dataclass(eq=False)
class TimeAxis:
    """``columns`` equal slices of [t0, t1] seconds; pass numbers by time through ``t_ns``."""

    t_ns: Sequence[int]  # every pass's time, ascending (the scan's array)
    t0: float
    t1: float
    columns: int

    @classmethod
    def of(cls, t_ns: Sequence[int], columns: int) -> TimeAxis | None:
        if not len(t_ns) or columns < 2:
            return None
        t0, t1 = t_ns[0] / 1e9, t_ns[-1] / 1e9
        return cls(t_ns, t0, max(t1, t0 + 1e-6), columns)

    def column_of(self, pass_no: int) -> int:
        """The column drawing pass ``pass_no``."""
        t = self.t_ns[max(0, min(pass_no, len(self.t_ns) - 1))] / 1e9
        return max(0, min(round((t - self.t0) / (self.t1 - self.t0) * (self.columns - 1)), self.columns - 1))

    def time_of(self, column: int) -> float:
        return self.t0 + (self.t1 - self.t0) * column / (self.columns - 1)

    def slice_of(self, column: int) -> tuple[int, int]:
        """Pass numbers [lo, hi) the column covers (half a column either side of its time)."""
        half = (self.t1 - self.t0) / (self.columns - 1) / 2
        t = self.time_of(column)
        lo = bisect_left(self.t_ns, round((t - half) * 1e9)) if column else 0
        hi = bisect_left(self.t_ns, round((t + half) * 1e9)) if column < self.columns - 1 else len(self.t_ns)
        return lo, hi

    def pass_at(self, column: int) -> int:
        """The pass a click on ``column`` picks: the last one at or before its time (else the first)."""
        i = bisect_right(self.t_ns, round(self.time_of(column) * 1e9)) - 1
        return max(i, 0)

    def ticks(self, every: int = 14) -> tuple[list[int], list[str]]:
        """About one time label per ``every`` columns, at round seconds: (columns, labels)."""
        span = self.t1 - self.t0
        step = _nice_step(span / max(self.columns // every, 1))
        first = -(-self.t0 // step) * step
        cols, labels = [], []
        t = first
        while t <= self.t1 + 1e-9:
            cols.append(round((t - self.t0) / span * (self.columns - 1)))
            labels.append(time_label(t))
            t += step
        return cols, labels


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, the nearest to ``raw``."""
    if raw <= 0:
        return 1.0
    power = 10 ** floor(log10(raw))
    return min((m * power for m in (1, 2, 5, 10)), key=lambda step: abs(log10(step / raw)))


def time_label(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:g}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}" if rest else f"{minutes}m"


def count_label(value: float) -> str:
    """An axis count in at most five characters: 950, 12.5k, 240k, 1.2M."""
    if value < 1000:
        return f"{value:g}"
    if value < 1e6:
        return f"{value / 1e3:.3g}k"
    return f"{value / 1e6:.3g}M"


@dataclass(eq=False)  # compared by identity (a reactive holds it)
class ChartData:
    """Per column: the KV stack and queue of one representative pass, and the head's need."""

    axis: TimeAxis
    series: dict[str, array]  # the scan's per-pass series, for the values at the cursor
    total: int  # max_total_tokens (the stack's top)
    max_running: int | None
    kv_pass: list[int] = field(default_factory=list)  # the column's most pressed pass (least free + evictable)
    free: list[int] = field(default_factory=list)
    evictable: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # the column's peaks
    running: list[int] = field(default_factory=list)
    need: list[float | None] = field(default_factory=list)  # see ``head_need_line``
    events: str = ""  # one GLYPHS character (or " ") per column, the most serious event's
    stalled: list[tuple[bool, ...]] = field(default_factory=list)  # per column, per arm (Marks.arms)


def kv_total(header: Header, scan: ScanResult) -> int:
    """The full pool's size (``capacity.kv_tokens``), else the most free + evictable seen."""
    total = capacity.kv_tokens(header)
    if total:
        return total
    free, evict = scan.series["kv_free"], scan.series["kv_evictable"]
    return max((f + e for f, e in zip(free, evict)), default=1) or 1


def head_need_line(p: Pass, header: Header) -> float | None:
    """Where the head's need stands on the KV stack (free at the bottom, then evictable).

    ``why``'s check admits the head iff its need is below the budget (free +
    evictable, less what the running decodes and earlier admissions reserve).
    Drawn at free + evictable − budget + need, the line is below the top of
    the evictable band exactly when the head fits. None: nobody's need was checked.
    """
    check = why(p, header).check
    if check is None or check.verdict not in _NEED_VERDICTS or check.need <= 0:
        return None
    return p.kv.available + p.kv.evictable - check.budget + check.need


def chart_data(scan: ScanResult, marks: Marks, header: Header, columns: int,
               pass_at: Callable[[int], Pass]) -> ChartData | None:
    """Every column's values; ``pass_at`` decodes the (at most ``columns``) passes the need is read from."""
    axis = TimeAxis.of(scan.t_ns, columns)
    if axis is None:
        return None
    data = ChartData(axis, scan.series, kv_total(header, scan), capacity.max_running(header))
    s = scan.series
    free, evict, waiting, running = s["kv_free"], s["kv_evictable"], s["waiting"], s["running"]
    need_of: dict[int, float | None] = {}
    for c in range(columns):
        lo, hi = axis.slice_of(c)
        if hi <= lo:  # no pass in this slice: the one before it still holds
            lo, hi = max(lo - 1, 0), max(lo, 1)
        kv = min(range(lo, hi), key=lambda n: free[n] + evict[n])
        data.kv_pass.append(kv)
        data.free.append(free[kv])
        data.evictable.append(evict[kv])
        data.used.append(max(data.total - free[kv] - evict[kv], 0))
        data.waiting.append(max(waiting[lo:hi]))
        data.running.append(max(running[lo:hi]))
        if kv not in need_of:
            need_of[kv] = head_need_line(pass_at(kv), header)
        data.need.append(need_of[kv])
    data.events = _event_cells(marks, axis)
    data.stalled = _stall_cells(marks, axis)
    return data


def _stall_cells(marks: Marks, axis: TimeAxis) -> list[tuple[bool, ...]]:
    """Per column, per arm: does a stall of that arm cover any of the column's time?"""
    cells = [[False] * len(marks.arms) for _ in range(axis.columns)]
    for run in marks.stall_runs():
        i = marks.arms.index(run.arm)
        for c in range(axis.column_of(run.start), axis.column_of(run.end) + 1):
            cells[c][i] = True
    return [tuple(cell) for cell in cells]


def _event_cells(marks: Marks, axis: TimeAxis) -> str:
    """One character per column; the more serious kind wins (the order of ``GLYPHS``)."""
    cells = [" "] * axis.columns
    passes = len(axis.t_ns)
    for kind in reversed(POINT_KINDS):
        points, glyph = marks.of(kind), GLYPHS[kind]
        for n in points:
            if 0 <= n < passes:
                cells[axis.column_of(n)] = glyph
    return "".join(cells)
