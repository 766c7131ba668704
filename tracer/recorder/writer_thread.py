"""Background writer: builds, encodes and writes records off the scheduler thread.

The scheduler thread calls ``submit`` (a ``deque.append`` and a length check,
no lock, never blocks). When the queue holds ``queue_size`` records, the newest
record is dropped and counted; the writer later writes a ``Loss`` record with
the exact number dropped since the last one. Because ``submit`` takes no lock,
it is also safe from a signal handler running on the scheduler thread.

The writer thread wakes every ``flush_interval_s`` (default 50 ms), runs
``on_tick`` (the recorder's control file), drains the queue, adds a ``Clock``
record every ``policy.clock_every_s``, builds the deferred records and hands
them to ``PartFiles`` (part_files.py: numbering, one write per batch, fsync
policy, rotation, the disk budget, write failures), then to the sinks.

Ring mode (``policy.ring_bytes`` > 0): built records go into a ``Ring`` of
that many encoded bytes instead of a file. When a trigger fires
(triggers.py: a stall, a failed allocation, a pass that raised, ``SIGUSR2``),
the ring and the batch that fired are written as a new part (after a
``Loss(reason="ring")`` counting what fell off the ring since the last
window), and recording goes on into that part for another ``ring_bytes``
(another trigger meanwhile extends it); then the part is closed and the ring
fills again. Nothing is written if nothing fires.

Deferred records: the producer may submit a ``Deferred`` instead of a record
(the recorder's pass capture: references to live requests plus the ints that
could change), or a deferred call, a tuple ``(build, *args)`` (an allocation's
ints: a tuple costs the scheduler thread less than any object). The writer
calls ``build()`` (or ``build(*args)``) just before numbering and writing, so
the schema Structs are made here, not on the scheduler thread. A build that
raises drops that record, counted in the footer as ``build_errors`` and
logged once.

GIL: building and encoding are Python work that holds the GIL; a scheduler
thread waking from a GPU wait would otherwise wait up to the interpreter's
switch interval (5 ms) for it. The writer therefore works in slices of at
most ``SLICE_NS`` and sleeps ``GIL_BREAK_S`` between slices, which hands the
GIL to a waiting thread.

Sinks: ``sinks`` is a list of callables ``sink(records: list[Record]) -> None``.
Each receives every batch after it has been written, in file order, on the
writer thread; the first batch of each part starts with that part's
``Header``. A sink with a ``close()`` method has it called once,
after the final batch. A sink must not keep or mutate the records; whatever
it raises is caught and counted (footer count ``sink_errors``, logged once
per sink).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from schedtrace.tracer.contract.names import DEFAULT_MAX_BYTES, DEFAULT_QUEUE_SIZE, LOSS_RING
from schedtrace.tracer.contract.schema import Clock, Loss, Record
from schedtrace.tracer.recorder.part_files import HeaderFactory, PartFiles
from schedtrace.tracer.recorder.policy import WriterPolicy
from schedtrace.tracer.recorder.ring import Ring
from schedtrace.tracer.recorder.triggers import Triggers

logger = logging.getLogger(__name__)

Sink = Callable[[list[Record]], None]

DEFAULT_FLUSH_INTERVAL_S = 0.05
SLICE_NS = 500_000  # longest stretch of building/encoding between GIL breaks
GIL_BREAK_S = 0.00002  # a real sleep (not sleep(0)): the waiting thread gets the GIL


class Deferred:
    """A record the writer thread builds: ``build()`` returns the schema record."""

    __slots__ = ()

    def build(self) -> Record:
        raise NotImplementedError


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
        policy: WriterPolicy | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.stem = stem
        self.policy = policy = policy or WriterPolicy()
        self.queue_size = max(1, queue_size)
        self.flush_interval_s = flush_interval_s
        self.sinks: list[Sink] = list(sinks or [])
        self._clock_ns = clock_ns
        self._on_tick = on_tick
        self._queue: deque[Record] = deque()
        # Written only by the producer thread; read by the writer thread.
        self.dropped = 0
        self._dropped_reported = 0
        self.sink_errors = 0
        self.build_errors = 0
        self.tick_errors = 0
        self._sinks_failed: set[int] = set()
        self.extra_counts: dict[str, int] = {}  # merged into every footer
        self._next_clock = time.monotonic() + policy.clock_every_s
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # serialises drain() between the thread and close()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._parts = PartFiles(self.directory, stem, make_header, clock_ns, max_bytes=max_bytes,
                                policy=policy, footer_counts=self._footer_counts)
        self.ring = Ring(policy.ring_bytes) if policy.ring else None
        self.triggers = Triggers(make_header(0, 0)) if policy.ring else None
        self.windows = 0  # ring mode: windows written
        self._window_until: int | None = None  # ring mode: bytes_written at which the open window ends
        if self.ring is None:
            self._parts.open(strict=True)  # an unusable directory fails here, not at the first record
        self._thread = threading.Thread(target=self._run, name="schedtrace-writer", daemon=True)
        self._thread.start()

    # --- what the parts say ---

    @property
    def paths(self) -> list[Path]:
        return self._parts.paths

    @property
    def part(self) -> int:
        return self._parts.part

    @property
    def next_pass_seq(self) -> int:
        return self._parts.next_pass_seq

    @property
    def bytes_written(self) -> int:
        """Bytes of records this writer put in its files, over every part (headers and footers aside)."""
        return self._parts.bytes_written

    @property
    def write_errors(self) -> int:
        return self._parts.write_errors

    # --- producer side (scheduler thread) ---

    def submit(self, record: Record) -> bool:
        """Queue one record; False if the queue was full and it was dropped."""
        queue = self._queue
        if len(queue) >= self.queue_size:
            self.dropped += 1
            return False
        queue.append(record)
        return True

    def submit_all(self, records: list) -> None:
        """``submit`` each of ``records`` in order, with one room check: those past a full queue are dropped."""
        queue = self._queue
        room = self.queue_size - len(queue)
        if len(records) <= room:
            queue.extend(records)
            return
        if room > 0:
            queue.extend(records[:room])
        self.dropped += len(records) - max(room, 0)

    # --- writer side ---

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            if self._on_tick is not None:
                self._tick()
            self.drain()

    def _tick(self) -> None:
        try:
            self._on_tick()
        except Exception:
            self.tick_errors += 1
            if self.tick_errors == 1:
                logger.exception("schedtrace: the writer's periodic check failed (counted, not logged again)")

    def drain(self) -> None:
        """Write everything queued now (writer thread, or close)."""
        with self._lock:
            if self._closed:
                return
            self._drain_locked()

    def _drain_locked(self) -> None:
        queue = self._queue
        batch: list = []
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
        now = time.monotonic()
        if now >= self._next_clock:
            batch.append(Clock(self._clock_ns(), time.time_ns()))
            self._next_clock = now + self.policy.clock_every_s
        if batch or (self.triggers is not None and self.triggers.requested):
            self._build_and_write(batch)

    def _build_and_write(self, queued: list) -> None:
        """Build deferred records and write them, in GIL-friendly slices."""
        clock = time.perf_counter_ns
        built: list[Record] = []
        slice_start = clock()
        for item in queued:
            if type(item) is tuple or isinstance(item, Deferred):
                try:
                    item = item[0](*item[1:]) if type(item) is tuple else item.build()
                except Exception:
                    self.build_errors += 1
                    if self.build_errors == 1:
                        logger.exception("schedtrace: building a deferred record failed (dropped, counted)")
                    continue
            built.append(item)
            if clock() - slice_start >= SLICE_NS:
                self._write(built)
                built = []
                time.sleep(GIL_BREAK_S)
                slice_start = clock()
        if built or not queued:
            self._write(built)

    def _write(self, records: list[Record]) -> None:
        landed = self._parts.write(records) if self.ring is None else self._ring_write(records)
        if self.sinks and landed:
            start, self._parts.unsent = self._parts.unsent, []
            self._feed_sinks(start + landed)

    # --- ring mode ---

    def _ring_write(self, records: list[Record]) -> list[Record]:
        """Keep ``records`` in the ring, or write them out: with the ring when a trigger fires."""
        assert self.ring is not None and self.triggers is not None
        parts, ring = self._parts, self.ring
        reason = self.triggers.check(records)
        if self._window_until is not None:
            landed = parts.write(records) if records else []
            if reason is not None:
                self._window_until = parts.bytes_written + ring.capacity
            elif parts.bytes_written >= self._window_until:
                parts.close_part()
                self._window_until = None
            return landed
        if reason is None:
            ring.add(records)
            return []
        window, discarded = ring.take()
        window.extend(records)
        if discarded:
            first_t = next((r.t_ns for r in window if hasattr(r, "t_ns")), self._clock_ns())
            window.insert(0, Loss(first_t, discarded, LOSS_RING))
        self.windows += 1
        landed = parts.write(window)
        logger.info("schedtrace: ring mode, %s: wrote the last %d records to %s", reason, len(landed), parts.path)
        self._window_until = parts.bytes_written + ring.capacity
        return landed

    # --- sinks ---

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

    # --- end ---

    def _footer_counts(self) -> dict[str, int]:
        counts = dict(self.extra_counts)
        for name in ("sink_errors", "build_errors", "tick_errors"):
            if getattr(self, name):
                counts[name] = getattr(self, name)
        return counts

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, write what is queued, then the footer. Idempotent."""
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        with self._lock:
            if self._closed:
                return
            self._drain_locked()
            self._parts.close_part()
            self._closed = True
        if self.ring is not None and not self.windows:
            logger.info("schedtrace: ring mode: no trigger fired; the last %d records held were not written",
                        self.ring.kept)
        self._close_sinks()
