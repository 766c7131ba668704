"""Open-loop replay of a whole trace: every recorded pass under two arms.

For each pass record, in file order: the old and the new arm decide on the
recorded inputs (``PassDriver.decide``); when the old arm is ``stock`` its
decision is checked against the recording (fidelity); when the arms differ,
the divergence is tagged with every fix that, applied alone, reproduces the
new arm's decision. Aiter events are replayed the same way. An arm that
raises is that arm's outcome for the pass and replay goes on.

Input problems: unknown record types are skipped and counted; a torn tail
ends the replay at the last whole record (``truncated_at``); a trace from
another sglang version replays with a warning, and fails only where a fix
cannot apply. A path is read past its unreadable regions (``skip_damaged``),
as the CLI opens every trace set: every pass present is replayed, and the
report's ``holes`` list the regions and the ``loss`` records
(``tracer.analysis.holes``), with a warning. A reader or rank the caller
opened strictly stops at its first corrupt record with ``TraceDamagedError``.

``jobs > 1`` (or an ``Executor`` with several workers: local processes or
Ray tasks) splits the pass records into contiguous ranges replayed by the
workers; their results are merged in file order, so the report is
byte-identical to a single-process run. ``retried_tasks`` counts the ranges
a backend ran again after a worker died.

The trace is a file or a ``RankTrace`` (one rank's parts read as one, byte
offsets global over the parts); workers reopen it from its part files
(``executor.TraceFiles``: shared paths, or bytes shipped by the backend).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import msgspec

from schedtrace.tracer.analysis.decision import recorded_decision, replay_inputs
from schedtrace.tracer.analysis.holes import holes_warning, scan_holes
from schedtrace.tracer.analysis.settings import unreplayed
from schedtrace.replay.differ import aiter_fidelity_fields, divergence_kinds, fidelity_fields, order_matches
from schedtrace.replay.driver import PassDriver
from schedtrace.replay.scale.executor import Executor, LocalExecutor, TraceFiles, local_paths, trace_files
from schedtrace.replay.hybrid import fix_notes
from schedtrace.arms.patching import sglang_version
from schedtrace.tracer.contract.report import ArmError, Decision, Divergence, Fidelity, Mismatch, Report
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, FIXED, STOCK, error_text
from schedtrace.tracer.analysis.stalls import StallScanner, both_stalled
from schedtrace.tracer.contract.errors import ReplayStateError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Aiter, Arrival, Finish, Pass, Retract
from schedtrace.tracer.contract.traceset import RankTrace, open_traceset, source_paths

logger = logging.getLogger(__name__)

TraceSource = str | os.PathLike[str] | RankTrace
Reader = TraceReader | RankTrace
ProgressCallback = Callable[[int, int], None]  # (pass records done, total)
DivergenceCallback = Callable[[Divergence], None]

NO_PREFIX_IDS = ("the trace holds no prefix ids (an older recorder): requests share no prefixes in replay, "
                 "and cache-aware queue orders are not checked")

# Below this many pass records a worker pool costs more than it saves.
MIN_PASSES_PER_JOB = 2000


class _StallRow(msgspec.Struct, array_like=True):
    """What stall detection needs of one pass, per arm (small, crosses processes)."""

    seq: int
    repeat: int
    idle_before: int
    head_rid: str | None
    stalled_old: bool
    stalled_new: bool


class _Chunk(msgspec.Struct):
    """The result of replaying one range of the trace."""

    passes: int = 0
    aiter_events: int = 0
    matched: int = 0
    total: int = 0
    order_matched: int = 0
    order_total: int = 0
    mismatches: list[Mismatch] = []
    divergences: list[Divergence] = []
    errors_old: list[ArmError] = []
    errors_new: list[ArmError] = []
    stall_rows: list[_StallRow] = []
    unknown_records: dict[str, int] = {}  # what this range's reader skipped
    truncated_at: int | None = None  # torn tail (only the last range can see one)


def check_variants(*variants: str) -> None:
    """Parse each variant and prepare its fixes now: a bad name or a fix that
    cannot apply to the installed sglang fails before any pass is replayed."""
    from schedtrace.arms.variants import parse_variant, prepared

    for variant in variants:
        for fix in sorted(parse_variant(variant)):
            prepared(fix)


def _fix_names() -> tuple[str, ...]:
    from schedtrace.arms.fixes import FIX_NAMES

    return FIX_NAMES


@dataclass
class _Replayer:
    """Replays records of one trace under two arms into a ``_Chunk``."""

    driver: PassDriver
    old: str
    new: str
    on_divergence: DivergenceCallback | None = None
    chunk: _Chunk = field(default_factory=_Chunk)

    def _decide(self, p: Pass, variant: str) -> Decision:
        try:
            return self.driver.decide(p, variant)
        except ReplayStateError as exc:  # this record cannot become sglang state
            return Decision(admitted=[], error=f"ReplayStateError: {exc}")

    def _divergence(self, pass_: int, t_ns: int, kinds: list[str], old: Decision, new: Decision, fixes: list[str]) -> None:
        divergence = Divergence(pass_=pass_, t_ns=t_ns, kinds=kinds, fixes=fixes, old=old, new=new)
        self.chunk.divergences.append(divergence)
        if self.on_divergence is not None:
            self.on_divergence(divergence)

    def on_pass(self, record: Pass) -> None:
        chunk = self.chunk
        chunk.passes += 1
        p = replay_inputs(record)
        old = self._decide(p, self.old)
        new = self._decide(p, self.new)
        if self.old == STOCK:
            recorded = recorded_decision(record)
            fields = fidelity_fields(recorded, old)
            chunk.total += 1
            if not fields:
                chunk.matched += 1
            if self.driver.header.prefix_block:  # a recorder that records the order
                chunk.order_total += 1
                if order_matches(recorded, old):
                    chunk.order_matched += 1
                else:
                    fields.append("queue_order")
            if fields:
                chunk.mismatches.append(Mismatch(pass_=record.seq, fields=fields, recorded=recorded, replayed=old))
        if old.error is not None:
            chunk.errors_old.append(ArmError(pass_=record.seq, error=old.error))
        if new.error is not None:
            chunk.errors_new.append(ArmError(pass_=record.seq, error=new.error))
        kinds = divergence_kinds(old, new)
        if kinds:
            fixes = [fix for fix in _fix_names() if not divergence_kinds(self._decide(p, fix), new)]
            self._divergence(record.seq, record.t_ns, kinds, old, new, fixes)
        head = p.waiting[0].rid if p.waiting else None
        header = self.driver.header
        chunk.stall_rows.append(
            _StallRow(
                record.seq, record.repeat, record.idle_before, head,
                *both_stalled(p, old, new, header),
            )
        )

    def _aiter(self, event: Aiter, variant: str) -> Decision:
        try:
            return Decision(admitted=[], aiter_method=self.driver.decide_aiter(event, variant))
        except ReplayStateError as exc:
            return Decision(admitted=[], error=f"ReplayStateError: {exc}")
        except Exception as exc:  # the real handler raised: that arm's outcome
            return Decision(admitted=[], error=error_text(exc))

    def on_aiter(self, event: Aiter) -> None:
        chunk = self.chunk
        chunk.aiter_events += 1
        old = self._aiter(event, self.old)
        new = self._aiter(event, self.new)
        if self.old == STOCK:
            chunk.total += 1
            fields = aiter_fidelity_fields(event.method, old)
            if fields:
                recorded = Decision(admitted=[], aiter_method=event.method)
                chunk.mismatches.append(Mismatch(pass_=event.pass_seq, fields=fields, recorded=recorded, replayed=old))
            else:
                chunk.matched += 1
        for arm_errors, decision in ((chunk.errors_old, old), (chunk.errors_new, new)):
            if decision.error is not None:
                arm_errors.append(ArmError(pass_=event.pass_seq, error=decision.error))
        kinds = divergence_kinds(old, new)
        if kinds:
            fixes = [fix for fix in _fix_names() if not divergence_kinds(self._aiter(event, fix), new)]
            self._divergence(event.pass_seq, event.t_ns, kinds, old, new, fixes)


def _driver(path, header) -> PassDriver:
    """The trace's driver; pools replay cannot rebuild are named with the file."""
    try:
        return PassDriver(header)
    except ReplayStateError as exc:
        raise ReplayStateError(f"{path}: {exc}") from None


@contextmanager
def opened(source: TraceSource) -> Iterator[Reader]:
    """A reader of ``source``: a path is opened here, past its unreadable regions (``skip_damaged``:
    replay what is present); a reader or a rank is the caller's, read as the caller opened it."""
    if isinstance(source, (RankTrace, TraceReader)):
        yield source
        return
    with TraceReader(source, skip_damaged=True) as reader:
        yield reader


@contextmanager
def reopened(paths: tuple[str, ...]) -> Iterator[Reader]:
    """``source`` again, in a worker, from ``source_paths(source)`` (same global offsets), past its gaps."""
    if len(paths) == 1:
        with TraceReader(paths[0], skip_damaged=True) as reader:
            yield reader
        return
    with open_traceset(paths, skip_damaged=True) as traces:
        yield traces.ranks[0]


def _replay_range(reader: Reader, replayer: _Replayer, start: int, stop: int | None, on_pass: Callable[[], None] | None = None) -> None:
    """Replay the records from byte offset ``start`` up to (not including) ``stop``.

    Arrivals, finishes, retractions and preemption releases feed the driver's
    book (prefix ids, priorities, queue entry times); a range that starts later
    reads them from the start of the trace (its passes' requests may have
    arrived long before)."""
    note = replayer.driver.note
    prescan = start > 0 and replayer.driver.reads_history
    for offset, record in reader.records(0 if prescan else start):
        if stop is not None and offset >= stop:
            break
        kind = type(record)
        if kind is Arrival or kind is Finish or kind is Retract:
            note(record)
            continue
        if offset < start:
            if kind is Pass:
                note(record)  # its preemption releases
            continue
        if kind is Pass:
            replayer.on_pass(record)
            note(record)  # after the pass: a release re-queues at its end
            if on_pass is not None:
                on_pass()
        elif kind is Aiter:
            replayer.on_aiter(record)


def _worker(args: tuple[TraceFiles, str, str, int, int | None]) -> bytes:
    """One range in a worker (a local process or a Ray task); msgpack out (no pickled objects)."""
    files, old, new, start, stop = args
    with local_paths(files) as paths, reopened(paths) as reader:
        replayer = _Replayer(_driver(files.paths[0], reader.header), old, new)
        _replay_range(reader, replayer, start, stop)
        replayer.chunk.unknown_records = dict(reader.unknown_records)
        replayer.chunk.truncated_at = reader.truncated_at
    return msgspec.msgpack.encode(replayer.chunk)


def _ranges(offsets, data_start: int, jobs: int) -> list[tuple[int, int | None]]:
    n = len(offsets)
    bounds = [n * k // jobs for k in range(jobs + 1)]
    starts = [data_start] + [offsets[b] for b in bounds[1:-1]]
    stops: list[int | None] = [offsets[b] for b in bounds[1:-1]] + [None]
    return list(zip(starts, stops))


def _merge(chunks: list[_Chunk]) -> _Chunk:
    out = _Chunk(mismatches=[], divergences=[], errors_old=[], errors_new=[], stall_rows=[], unknown_records={})
    for c in chunks:
        out.passes += c.passes
        out.aiter_events += c.aiter_events
        out.matched += c.matched
        out.total += c.total
        out.order_matched += c.order_matched
        out.order_total += c.order_total
        out.mismatches += c.mismatches
        out.divergences += c.divergences
        out.errors_old += c.errors_old
        out.errors_new += c.errors_new
        out.stall_rows += c.stall_rows
        for tag, n in c.unknown_records.items():
            out.unknown_records[tag] = out.unknown_records.get(tag, 0) + n
        if c.truncated_at is not None:
            out.truncated_at = c.truncated_at
    return out


def replay_trace(
    path: TraceSource,
    old: str = STOCK,
    new: str = FIXED,
    *,
    stall_passes: int = DEFAULT_STALL_PASSES,
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
    on_divergence: DivergenceCallback | None = None,
    executor: Executor | None = None,
    min_passes_per_job: int = MIN_PASSES_PER_JOB,
) -> Report:
    """Replay every pass of the trace at ``path`` (a file or a rank's parts) under ``old`` and ``new``.

    The pass ranges run on ``executor`` (default: ``jobs`` local processes), one range per
    worker of at least ``min_passes_per_job`` pass records."""
    if stall_passes < 1:
        raise UsageError("--stall-passes must be at least 1")
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    check_variants(old, new)
    warnings: list[str] = []
    with opened(path) as reader:
        name = reader.path
        header = reader.header
        driver = _driver(name, header)  # before any work: refuses pools it cannot rebuild
        installed = sglang_version()
        if header.sglang_version != installed:
            message = f"trace recorded with sglang {header.sglang_version}, replaying with {installed}"
            warnings.append(message)
            logger.warning("%s: %s", name, message)
        if not header.prefix_block:
            warnings.append(NO_PREFIX_IDS)
        warnings += unreplayed(header.settings)
        total = reader.pass_count  # one scan of an unclosed file; finds a torn tail
        fingerprint = reader.fingerprint()
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            if on_progress is not None and (done % 64 == 0 or done == total):
                on_progress(done, total)

        if on_progress is not None:
            on_progress(0, total)
        executor = executor if executor is not None else LocalExecutor(jobs)
        retried = executor.retried
        if executor.workers > 1 and total >= 2 * min_passes_per_job:
            jobs = min(executor.workers, total // min_passes_per_job)
            ranges = _ranges(reader.pass_offsets, 0, jobs)
            files = executor.locate(trace_files(source_paths(path)))
            work = [(files, old, new, start, stop) for start, stop in ranges]
            chunks = [msgspec.msgpack.decode(data, type=_Chunk) for data in executor.map(_worker, work)]
            for chunk in chunks:
                for divergence in chunk.divergences:
                    if on_divergence is not None:
                        on_divergence(divergence)
            result = _merge(chunks)
            # Unknown records and the torn tail, as a single-process run sees them (kept
            # here: a RankTrace's tallies are read-only).
            unknown_seen = Counter(reader.unknown_records) + Counter(result.unknown_records)
            truncated_at = result.truncated_at if result.truncated_at is not None else reader.truncated_at
            if on_progress is not None:
                on_progress(total, total)
        else:
            replayer = _Replayer(driver, old, new, on_divergence)
            _replay_range(reader, replayer, 0, None, tick)
            result = replayer.chunk
            unknown_seen = Counter(reader.unknown_records)
            truncated_at = reader.truncated_at
            if on_progress is not None:
                on_progress(done, total)
        unknown = dict(sorted(unknown_seen.items()))
        retried = executor.retried - retried
        if truncated_at is not None:
            warnings.append(f"trace ends in a torn record at offset {truncated_at}; replayed the {result.passes} passes before it")
        holes = scan_holes(reader)
        hole_warning = holes_warning(holes, result.passes)
        if hole_warning is not None:
            warnings.append(hole_warning)

    stalls = {}
    for arm, attr in ((old, "stalled_old"), (new, "stalled_new")):
        scanner = StallScanner(stall_passes, header)
        for row in result.stall_rows:
            scanner.feed(row.seq, row.repeat, row.idle_before, getattr(row, attr), row.head_rid)
        stalls[arm] = scanner.finish()
    errors = {old: result.errors_old, new: result.errors_new}
    return Report(
        trace=str(name),
        sglang_version=installed,
        trace_sglang_version=header.sglang_version,
        old=old,
        new=new,
        passes=result.passes,
        truncated_at=truncated_at,
        unknown_records=unknown,
        fidelity=Fidelity(arm=old, matched=result.matched, total=result.total, mismatches=result.mismatches,
                          order_matched=result.order_matched, order_total=result.order_total),
        divergences=result.divergences,
        stalls=stalls,
        errors=errors,
        aiter_events=result.aiter_events,
        warnings=warnings,
        fix_notes=fix_notes(header),
        trace_fingerprint=fingerprint,
        retried_tasks=retried,
        holes=holes,
    )
