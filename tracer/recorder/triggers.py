"""What makes ring mode write its window out (writer thread, on records as they are built).

* ``stall``: a stalled run reaching ``DEFAULT_STALL_PASSES`` passes by the one
  stall rule (``schedtrace.tracer.analysis.stalls``, with the trace's own
  header as the server's configuration), once per run;
* ``alloc_failed``: an ``Alloc`` record with ``ok`` False;
* ``pass_error``: a ``Pass`` whose ``error`` is set (the pass raised);
* ``signal``: ``request`` was called (the recorder's SIGUSR2 handler does; it
  only sets an attribute, so it is safe in a signal handler).
"""

from __future__ import annotations

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.schema import Alloc, Header, Pass, Record

STALL = "stall"
ALLOC_FAILED = "alloc_failed"
PASS_ERROR = "pass_error"
SIGNAL = "signal"

# A scanner keeps every stall it closed; ring mode needs none of them once seen.
_KEEP_STALLS = 64


class Triggers:
    def __init__(self, header: Header, min_passes: int = DEFAULT_STALL_PASSES) -> None:
        self.min_passes = min_passes
        self.requested: str | None = None  # written by ``request`` (any thread, a signal handler)
        self._scanner = StallScanner(min_passes, header)
        self._seq = 0  # the scanner's pass numbers: passes seen, not yet numbered for the file
        self._run_start: int | None = None
        self._run_passes = 0
        self._fired_run: int | None = None

    def request(self, reason: str = SIGNAL) -> None:
        self.requested = reason

    def check(self, records: list[Record]) -> str | None:
        """The first trigger among ``records`` (in order), else a requested one, else None."""
        reason = None
        for record in records:
            kind = type(record)
            if kind is Pass:
                found = PASS_ERROR if record.error is not None else self._stall(record)
            elif kind is Alloc:
                found = None if record.ok else ALLOC_FAILED
            else:
                continue
            reason = reason or found
        requested, self.requested = self.requested, None
        return reason or requested

    def _stall(self, p: Pass) -> str | None:
        scanner = self._scanner
        stalled = scanner.feed_pass(p, recorded_decision(p), self._seq)
        self._seq += 1
        if len(scanner.stalls) > _KEEP_STALLS:
            scanner.stalls.clear()
        start = scanner.open_run_start
        if not stalled or start is None:
            self._run_start, self._run_passes = None, 0
            return None
        if start != self._run_start:
            self._run_start, self._run_passes = start, 0
        self._run_passes += max(p.repeat, 1)
        if self._run_passes >= self.min_passes and self._fired_run != start:
            self._fired_run = start
            return STALL
        return None
