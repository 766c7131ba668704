"""The wall time of a trace's ``t_ns``, so ranks (and a collector) share one timeline.

``t_ns`` is monotonic since the header's start. Its wall time is
``start_wall_ns + t_ns`` until the first ``Clock`` record, then
``wall_ns - t_ns`` of the latest ``Clock`` record read so far plus ``t_ns``:
the nearest clock record before each event, in file order, so a rank whose
wall clock was stepped (NTP) or drifted is placed where the recorder saw it.
"""

from __future__ import annotations

from schedtrace.tracer.contract.schema import Clock, Header


class WallClock:
    """Feed it the trace's ``Clock`` records in file order; ask it ``wall_ns(t_ns)``."""

    def __init__(self, offset: int) -> None:
        self.offset = offset  # wall_ns - t_ns

    @classmethod
    def of(cls, header: Header) -> WallClock:
        return cls(header.start_wall_ns)

    def observe(self, record: Clock) -> None:
        self.offset = record.wall_ns - record.t_ns

    def wall_ns(self, t_ns: int) -> int:
        return self.offset + t_ns
