"""Time order and folding: every record the recorder writes goes through an ``Emitter``.

* Idle passes are only counted (``idle``); the count is written as one
  ``Idle`` record before the next record, so the file keeps time order.
* A rejected pass (nothing admitted, no chunk) is held back; identical
  rejected passes that follow within ``FOLD_WINDOW_NS`` with no record in
  between fold into it (``repeat`` += 1, ``dur_ns`` summed). They compare by
  the key the caller passes (``PassCapture.fold_key``), before anything is
  built, so a folded repeat builds nothing at all.

Scheduler thread only; the writer it submits to encodes and writes off it.
"""

from __future__ import annotations

from collections.abc import Callable

from schedtrace.tracer.contract.schema import Idle, Pass, Record
from schedtrace.tracer.recorder.capture import PassCapture
from schedtrace.tracer.recorder.writer_thread import WriterThread

# A held rejected pass is written at the latest this long after it started,
# so a scheduler stuck in identical passes still shows up in the file.
FOLD_WINDOW_NS = 100_000_000


class Emitter:
    """Queues records on a writer in time order, folding repeated rejected passes.

    ``start`` returns the writer (starting it on first use), or None while
    there is none: records are then dropped, as the recorder is off.
    """

    __slots__ = ("idle", "writer", "_clock", "_start", "_held", "_held_key")

    def __init__(self, clock_ns: Callable[[], int], start: Callable[[], WriterThread | None]) -> None:
        # Idle passes since the previous record. The pass hook bumps it with a
        # bare ``+= 1``: that increment is the whole cost of an idle pass.
        self.idle = 0
        self.writer: WriterThread | None = None
        self._clock = clock_ns
        self._start = start
        self._held: Pass | PassCapture | None = None
        self._held_key: tuple | None = None

    def _started(self) -> WriterThread | None:
        writer = self.writer = self._start()
        return writer

    def emit(self, record: Record) -> None:
        """Queue one event record, after the held pass and the idle count."""
        writer = self.flush()
        if writer is not None:
            writer.submit(record)

    def emit_pass(self, record: Pass | PassCapture, foldable: bool, key: tuple | None, events: list = ()) -> None:
        """Write a pass and then ``events`` (what the pass raised), or hold a foldable
        (rejected, so event-free) one to fold its repeats into.

        A held capture's ``repeat`` and ``dur_ns`` grow; it is built once, when written.
        """
        writer = self.writer or self._started()
        if writer is None:
            return
        held = self._held
        if held is not None:
            if (
                foldable
                and not self.idle
                and key == self._held_key
                and record.t_ns - held.t_ns < FOLD_WINDOW_NS
            ):
                held.repeat += 1
                held.dur_ns += record.dur_ns
                return
            self._submit_held(writer)
        if self.idle:
            record.idle_before = self.idle
            self._submit_idle(writer)
        if foldable:
            self._held = record
            self._held_key = key
        elif events:
            writer.submit_all([record, *events])  # one room check for the pass and its events
        else:
            writer.submit(record)

    def flush(self) -> WriterThread | None:
        """Queue what is held back now (the held pass, then the idle count); returns the writer."""
        writer = self.writer or self._started()
        if writer is None:
            return None
        if self._held is not None:
            self._submit_held(writer)
        if self.idle:
            self._submit_idle(writer)
        return writer

    def _submit_held(self, writer: WriterThread) -> None:
        held, self._held, self._held_key = self._held, None, None
        writer.submit(held)

    def _submit_idle(self, writer: WriterThread) -> None:
        writer.submit(Idle(self._clock(), self.idle))
        self.idle = 0
