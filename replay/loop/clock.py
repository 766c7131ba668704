"""Recorded time <-> scheduler pass number, for placing arrivals in a closed loop."""

from __future__ import annotations

import bisect as _bisect
from typing import Final

DEFAULT_PASS_NS: Final = 1_000_000  # pass period when the trace has too few passes to tell


class PassClock:
    """Recorded time <-> scheduler pass number, idle and folded passes included.

    Built from (pass number, t_ns) points; times between points are linear,
    times after the last point go on at the trace's mean pass period.
    """

    def __init__(self, points: list[tuple[int, int]]) -> None:
        self.iterations: list[int] = []
        self.times: list[int] = []
        for iteration, t_ns in points:
            if self.times:
                t_ns = max(t_ns, self.times[-1])  # untrusted clocks never run backwards here
            self.iterations.append(iteration)
            self.times.append(t_ns)
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
        i = _bisect.bisect_left(self.times, t_ns)
        return self.iterations[i] if i < len(self.times) else self.iteration_at(t_ns)

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
