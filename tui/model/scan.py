"""One pass over every record of a trace: timeline series, outcomes, errors, stalls, rid spans, losses."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.outcome import OUTCOMES, pass_outcome
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.errors import TraceFormatError
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.schema import Abort, Alloc, Arrival, Finish, Loss, Pass, Retract
from schedtrace.tui.model.latch import LatchRuns
from schedtrace.tui.model.rank_set import Reader
from schedtrace.tui.model.rids import RidIndex

SERIES: Final = ("waiting", "running", "kv_free", "kv_evictable", "chunk")
OUTCOME_CODE: Final = {name: code for code, name in enumerate(OUTCOMES)}  # one byte per pass in ScanResult.results
CANCEL_CHECK_EVERY: Final = 1_000  # passes between looks at ``cancelled``: quitting must not wait for the scan
MAX_LOSS_EVENTS: Final = 10_000  # loss records kept one by one (every one is counted in ``losses``)


@dataclass(frozen=True)
class LossAt:
    """A ``loss`` record: ``count`` records the recorder dropped (``reason``) after pass ``after``."""

    after: int  # the pass before it (0 for one before the first pass)
    count: int
    reason: str


@dataclass(eq=False)  # compared by identity: the app's reactive must not walk every array
class ScanResult:
    """What one pass over every record yields; arrays are indexed by pass number."""

    series: dict[str, array] = field(default_factory=lambda: {name: array("q") for name in SERIES})
    t_ns: array = field(default_factory=lambda: array("q"))
    results: array = field(default_factory=lambda: array("B"))  # codes into OUTCOMES
    error_passes: array = field(default_factory=lambda: array("q"))  # raised, or a failed alloc
    failed_allocs: array = field(default_factory=lambda: array("q"))
    rids: RidIndex = field(default_factory=RidIndex)
    stalls: list[tuple[int, int]] = field(default_factory=list)  # recorded stalls, by the analysis.stalls rules
    latch: LatchRuns = field(default_factory=LatchRuns)
    losses: int = 0
    loss_events: list[LossAt] = field(default_factory=list)  # the first MAX_LOSS_EVENTS, in order
    end_ns: int = 0
    truncated_at: int | None = None
    failure: str | None = None  # the format error that ended the scan early

    @property
    def passes(self) -> int:
        return len(self.t_ns)


def scan_trace(reader: Reader, *, on_progress: Callable[[int, int], None] | None = None,
               cancelled: Callable[[], bool] = lambda: False, every: int = 20_000,
               stall_passes: int = DEFAULT_STALL_PASSES) -> ScanResult:
    """Read every record once: the timeline series, error passes and rid spans.

    ``reader`` must not be used by another thread meanwhile (it seeks its
    file); give the scan its own reader. A format error ends the scan early
    with what was read so far and the error in ``failure``.
    """
    out = ScanResult()
    # The header, not max_running_requests alone: the rule then uses the real page size and policy.
    stall_scanner = StallScanner(stall_passes, reader.header)
    latch_feed = out.latch.feed
    s = out.series
    waiting, running, kv_free, kv_evict, chunk = (s[name] for name in SERIES)
    rids = out.rids
    touch = rids.touch
    pending_arrivals: list[tuple[str, int]] = []
    last_pass = -1
    first_pass = reader.header.first_pass
    end_ns = 0
    size = max(reader.data_end, 1)
    try:
        for offset, record in reader.records():
            kind = type(record)
            if kind is Pass:
                n = record.seq - first_pass
                if n > len(out.t_ns):
                    _hold_over_lost(out, n, record.t_ns)
                last_pass = n = len(out.t_ns)
                out.t_ns.append(record.t_ns)
                waiting.append(len(record.waiting))
                running.append(len(record.running))
                kv_free.append(record.kv.available)
                kv_evict.append(record.kv.evictable)
                chunk.append((record.chunk.size or 0) if record.chunk else 0)
                out.results.append(OUTCOME_CODE[pass_outcome(record)])
                if record.error:
                    out.error_passes.append(n)
                stall_scanner.feed_pass(record, recorded_decision(record), seq=n)
                latch_feed(n, record.seq, record.batch_is_full_in, record.batch_is_full_out)
                for rid, at in pending_arrivals:
                    rids.arrived(rid, n, at)
                pending_arrivals.clear()
                for c in record.candidates:
                    touch(c.rid, n)
                for a in record.admitted:
                    touch(a.rid, n)
                if record.chunked is not None:
                    touch(record.chunked.rid, n)
                if n % every == 0:
                    # Drop the mapped pages already read, so a big scan does not count the
                    # whole file in our RSS.
                    reader.release_pages(offset)
                    if on_progress is not None:
                        on_progress(offset, size)
                if n % CANCEL_CHECK_EVERY == 0 and cancelled():
                    break
            elif kind is Arrival:
                pending_arrivals.append((record.rid, record.t_ns))
            elif kind is Finish or kind is Abort:
                rids.finished(record.rid, last_pass, record.reason if kind is Finish else "abort", record.t_ns)
            elif kind is Retract:
                touch(record.rid, max(last_pass, 0))
            elif kind is Alloc:
                if not record.ok:
                    out.failed_allocs.append(record.pass_seq)
                    out.error_passes.append(record.pass_seq)
            elif kind is Loss:
                out.losses += record.count
                if len(out.loss_events) < MAX_LOSS_EVENTS:
                    out.loss_events.append(LossAt(max(last_pass, 0), record.count, record.reason))
            end_ns = max(end_ns, getattr(record, "t_ns", 0))
    except TraceFormatError as exc:
        out.failure = str(exc)
    out.end_ns = end_ns
    out.truncated_at = reader.truncated_at
    out.stalls = [(st.start_pass, st.end_pass) for st in stall_scanner.finish()]
    rids.freeze()
    # Sorted and unique, so bisect can walk them.
    out.error_passes = array("q", sorted(set(p for p in out.error_passes if p >= 0)))
    return out


def _hold_over_lost(out: ScanResult, upto: int, next_t_ns: int) -> None:
    """Passes before ``upto`` lost in a gap (read past with skip_damaged): keep arrays indexed by pass
    number, each lost pass holding the values of the pass before it (outcome "none")."""
    missing = upto - len(out.t_ns)
    last = len(out.t_ns) - 1
    for name, values in out.series.items():
        values.extend([values[last] if last >= 0 else 0] * missing)
    out.t_ns.extend([out.t_ns[last] if last >= 0 else next_t_ns] * missing)
    out.results.extend([OUTCOME_CODE["none"]] * missing)
