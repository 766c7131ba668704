"""Recorded time <-> scheduler pass number, for placing arrivals in a closed loop."""

from __future__ import annotations

import bisect as _bisect
from collections.abc import Sequence
from typing import Final

from schedtrace.tracer.contract.schema import Clock, Header, Idle, Pass, Record

DEFAULT_PASS_NS: Final = 1_000_000  # pass period when the trace has too few passes to tell


class PassClock:
    """Recorded time <-> scheduler pass number, idle and folded passes included.

    Built from (pass number, t_ns) points of the pass records and ``marks``
    (``IdleMarks``, of the idle passes between them); times between points
    are linear, times after the last point go on at the trace's mean pass period.
    """

    def __init__(self, points: Sequence[tuple[int, int]], marks: Sequence[tuple[int, int]] = ()) -> None:
        self.iterations, self.times = _monotonic(sorted([*points, *marks]) if marks else points)
        self._records = _monotonic(points)  # (iterations, times) of the pass records alone
        span_it = self.iterations[-1] - self.iterations[0] if points else 0
        span_ns = self.times[-1] - self.times[0] if points else 0
        self.period_ns = span_ns // span_it if span_it > 0 and span_ns > 0 else DEFAULT_PASS_NS
        self.period_ns = max(self.period_ns, 1)

    def iteration_at(self, t_ns: int) -> int:
        """The first pass that starts at or after ``t_ns``."""
        if not self.times:
            return 0
        i = _bisect.bisect_right(self.times, t_ns) - 1
        if i < 0:
            return self.iterations[0]
        if self.times[i] == t_ns:
            return self.iterations[_bisect.bisect_left(self.times, t_ns)]
        if i == len(self.times) - 1:
            return self.iterations[i] + -(-(t_ns - self.times[i]) // self.period_ns)
        d_it = self.iterations[i + 1] - self.iterations[i]
        d_t = self.times[i + 1] - self.times[i]
        return self.iterations[i] + -(-(t_ns - self.times[i]) * d_it // d_t)

    def record_after(self, t_ns: int) -> int:
        """The pass of the first point at or after ``t_ns``: the pass record that first sees what
        happened then (an arrival, an abort), since a pass with a request waiting is never idle
        and so always recorded; past the last point, ``iteration_at``'s estimate."""
        iterations, times = self._records
        i = _bisect.bisect_left(times, t_ns)
        return iterations[i] if i < len(times) else self.iteration_at(t_ns)

    def time_at(self, iteration: int) -> int:
        if not self.times:
            return iteration * self.period_ns
        i = _bisect.bisect_right(self.iterations, iteration) - 1
        if i < 0:
            return self.times[0]
        if i == len(self.iterations) - 1:
            return self.times[i] + (iteration - self.iterations[i]) * self.period_ns
        d_it = self.iterations[i + 1] - self.iterations[i]
        d_t = self.times[i + 1] - self.times[i]
        return self.times[i] + (iteration - self.iterations[i]) * d_t // d_it


def _monotonic(points) -> tuple[list[int], list[int]]:
    """Iterations and times of ``points``; untrusted clocks never run backwards here."""
    iterations: list[int] = []
    times: list[int] = []
    for iteration, t_ns in points:
        iterations.append(iteration)
        times.append(max(t_ns, times[-1]) if times else t_ns)
    return iterations, times


class IdleMarks:
    """Clock points from ``idle`` records, read in file order with the records after them.

    The recorder writes its idle count just before the next record it writes. When that is an
    event, the event came in the last idle pass counted (a decode pass allocates, a request
    finishes): that pass began before the first of them, and the next pass starts after every
    event up to the next pass or idle record. Two points: (the last idle pass, just before the
    first event) and (the pass after it, the latest). A count written before a pass record, or
    at close, is no point: the pass record is, and nothing came after.
    """

    def __init__(self) -> None:
        self.points: list[tuple[int, int]] = []
        self._open: int | None = None  # the pass after the last idle run, until a pass or idle record
        self._t_ns = 0

    def idle(self, next_pass: int, t_ns: int) -> None:
        self._open = next_pass
        self._t_ns = t_ns

    def see(self, record: Record) -> None:
        """Every record, in file order (an ``idle`` one before ``idle``)."""
        kind = type(record)
        if kind is Pass or kind is Idle:  # the end of the last idle pass's events
            self._open = None
        elif self._open is not None and kind is not Clock and kind is not Header:  # a clock is the writer's
            self._event(record.t_ns)

    def _event(self, t_ns: int) -> None:
        if self.points and self.points[-1][0] == self._open:
            self.points[-1] = (self._open, max(t_ns, self.points[-1][1]))
        else:  # the first: the idle pass began before it, the next pass after the last
            self.points += [(self._open - 1, t_ns - 1), (self._open, max(t_ns, self._t_ns))]
