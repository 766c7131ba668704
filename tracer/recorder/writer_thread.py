"""Background writer: encodes and writes records off the scheduler thread.

The scheduler thread calls ``submit`` (a ``deque.append`` and a length check,
no lock, never blocks). When the queue holds ``queue_size`` records, the newest
record is dropped and counted; the writer later writes a ``Loss`` record with
the exact number dropped since the last one. Because ``submit`` takes no lock,
it is also safe from a signal handler running on the scheduler thread.

The writer thread wakes every ``flush_interval_s`` (default 50 ms), drains the
queue, numbers pass records (``Pass.seq`` and the ``pass_seq`` of events are
assigned here, so they stay consecutive over *written* passes even when
records are dropped), writes the batch with one ``os.write`` through
``TraceWriter``, hands the batch to the sinks and rotates to a new part when
the file passes ``max_bytes``.

Deferred records: the producer may submit a ``Deferred`` instead of a record
(the recorder's pass capture: references to live requests plus the ints that
could change). The writer calls its ``build()`` just before numbering and
writing, so the schema Structs are made here, not on the scheduler thread.
A ``build()`` that raises drops that record, counted in the footer as
``build_errors`` and logged once.

GIL: building and encoding are Python work that holds the GIL; a scheduler
thread waking from a GPU wait would otherwise wait up to the interpreter's
switch interval (5 ms) for it. The writer therefore works in slices of at
most ``SLICE_NS`` and sleeps ``GIL_BREAK_S`` between slices, which hands the
GIL to a waiting thread.

Sinks: ``sinks`` is a list of callables ``sink(records: list[Record]) -> None``.
Each receives every batch after it has been written, in file order, on the
writer thread; the first batch of each part starts with that part's
``Header``. A sink with a ``close()`` method has it called once, after the
final batch. A sink must not keep or mutate the records; whatever it raises
is caught and counted (footer count ``sink_errors``, logged once per sink).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from schedtrace.tracer.contract.format import TraceWriter
from schedtrace.tracer.contract.schema import Aiter, Alloc, Header, Idle, Loss, Pass, Record

logger = logging.getLogger(__name__)

Sink = Callable[[list[Record]], None]
HeaderFactory = Callable[[int, int], Header]  # (part, first_pass) -> Header

DEFAULT_QUEUE_SIZE = 65536
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_FLUSH_INTERVAL_S = 0.05
SLICE_NS = 500_000  # longest stretch of building/encoding between GIL breaks
GIL_BREAK_S = 0.00002  # a real sleep (not sleep(0)): the waiting thread gets the GIL


class Deferred:
    """A record the writer thread builds: ``build()`` returns the schema record."""

    __slots__ = ()

    def build(self) -> Record:
        raise NotImplementedError


def part_path(directory: Path, stem: str, part: int) -> Path:
    return directory / f"{stem}.part{part:03d}.trace"


class WriterThread:
    """Owns the trace files of one scheduler process."""

    def __init__(
        self,
        directory: str | os.PathLike,
        stem: str,
        make_header: HeaderFactory,
        *,
        clock_ns: Callable[[], int],
        queue_size: int = DEFAULT_QUEUE_SIZE,
        max_bytes: int = DEFAULT_MAX_BYTES,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        sinks: list[Sink] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.stem = stem
        self.queue_size = max(1, queue_size)
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self.sinks: list[Sink] = list(sinks or [])
        self._make_header = make_header
        self._clock_ns = clock_ns
        self._queue: deque[Record] = deque()
        # Written only by the producer thread; read by the writer thread.
        self.dropped = 0
        self._dropped_reported = 0
        self.write_errors = 0
        self.sink_errors = 0
        self.build_errors = 0
        self._sinks_failed: set[int] = set()
        self.extra_counts: dict[str, int] = {}  # merged into every footer
        self.next_pass_seq = 0
        self._part_idle = 0  # idle passes counted by Idle records in this part
        self._part_lost = 0  # records reported by Loss records in this part
        self.part = 0
        self.paths: list[Path] = []
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # serialises drain() between the thread and close()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer = self._open_part()
        self._thread = threading.Thread(target=self._run, name="schedtrace-writer", daemon=True)
        self._thread.start()

    # --- producer side (scheduler thread) ---

    def submit(self, record: Record) -> bool:
        """Queue one record; False if the queue was full and it was dropped."""
        queue = self._queue
        if len(queue) >= self.queue_size:
            self.dropped += 1
            return False
        queue.append(record)
        return True

    # --- writer side ---

    def _open_part(self) -> TraceWriter:
        path = part_path(self.directory, self.stem, self.part)
        self.paths.append(path)
        header = self._make_header(self.part, self.next_pass_seq)
        self._unsent_header: Header | None = header  # sinks see it with the next batch
        return TraceWriter(path, header)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self.drain()

    def drain(self) -> None:
        """Write everything queued now (writer thread, or close)."""
        with self._lock:
            if self._closed:
                return
            self._drain_locked()

    def _drain_locked(self) -> None:
        queue = self._queue
        batch: list[Record] = []
        pop = queue.popleft
        try:
            while True:
                batch.append(pop())
        except IndexError:
            pass
        dropped = self.dropped
        if dropped != self._dropped_reported:
            batch.append(Loss(self._clock_ns(), dropped - self._dropped_reported))
            self._dropped_reported = dropped
        if not batch:
            return
        batch = self._build_and_write(batch)
        if batch is None:
            return
        if self.sinks:
            header, self._unsent_header = self._unsent_header, None
            self._feed_sinks([header, *batch] if header is not None else batch)
        if self._writer.size >= self.max_bytes:
            self._close_part()
            self.part += 1
            self._part_idle = self._part_lost = 0
            self._writer = self._open_part()

    def _build_and_write(self, queued: list) -> list[Record] | None:
        """Build deferred records, number passes, write; in GIL-friendly slices."""
        clock = time.perf_counter_ns
        batch: list[Record] = []
        start = 0  # first record of the slice not yet written
        slice_start = clock()
        seq = self.next_pass_seq
        ok = True
        for index, item in enumerate(queued):
            if isinstance(item, Deferred):
                try:
                    record = item.build()
                except Exception:
                    self.build_errors += 1
                    if self.build_errors == 1:
                        logger.exception("schedtrace: building a deferred record failed (dropped, counted)")
                    continue
            else:
                record = item
            kind = type(record)
            if kind is Pass:
                record.seq = seq
                seq += 1
            elif kind is Alloc or kind is Aiter:
                record.pass_seq = seq - 1
            elif kind is Idle:
                self._part_idle += record.count
            elif kind is Loss:
                self._part_lost += record.count
            batch.append(record)
            if clock() - slice_start >= SLICE_NS:
                ok = self._write(batch[start:])
                start = len(batch)
                if not ok:
                    self.write_errors += len(queued) - index - 1  # the rest is lost with it
                    break
                time.sleep(GIL_BREAK_S)
                slice_start = clock()
        self.next_pass_seq = seq
        if ok and start < len(batch):
            ok = self._write(batch[start:])
        return batch if ok else None

    def _write(self, records: list[Record]) -> bool:
        try:
            self._writer.write_many(records)
        except OSError as exc:
            self.write_errors += len(records)
            logger.error("schedtrace: cannot write %s: %s", self._writer.path, exc)
            return False
        return True

    def _feed_sinks(self, batch: list[Record]) -> None:
        for sink in self.sinks:
            self._call_sink(sink, sink, batch)

    def _call_sink(self, sink: Sink, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            self.sink_errors += 1
            if id(sink) not in self._sinks_failed:
                self._sinks_failed.add(id(sink))
                logger.exception("schedtrace: trace sink %r failed (counted, not retried)", sink)

    def _close_sinks(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                self._call_sink(sink, close)

    def _footer_counts(self) -> dict[str, int]:
        counts = dict(self.extra_counts)
        counts["idle_passes"] = self._part_idle
        counts["lost"] = self._part_lost
        if self.write_errors:
            counts["write_errors"] = self.write_errors
        if self.sink_errors:
            counts["sink_errors"] = self.sink_errors
        if self.build_errors:
            counts["build_errors"] = self.build_errors
        return counts

    def _close_part(self) -> None:
        try:
            self._writer.close(self._clock_ns(), self._footer_counts())
        except OSError as exc:
            logger.error("schedtrace: cannot close %s: %s", self._writer.path, exc)
            self._writer.abandon()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, write what is queued, then the footer. Idempotent."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        with self._lock:
            if self._closed:
                return
            self._drain_locked()
            self._close_part()
            self._closed = True
        self._close_sinks()

    def abandon(self) -> None:
        """Stop without footer (tests: mimic a crash after the last write)."""
        self._stop.set()
        self._thread.join(5.0)
        with self._lock:
            self._closed = True
            self._writer.abandon()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Block until the queue is empty (tests and shutdown only)."""
        deadline = time.monotonic() + timeout_s
        while self._queue and time.monotonic() < deadline:
            time.sleep(self.flush_interval_s / 4)
        self.drain()
