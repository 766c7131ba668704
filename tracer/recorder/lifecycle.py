"""The ``Recorder`` of one sglang process: its state, and what the hooks call.

One ``Recorder`` lives in each process that loads the plugin, but it only
ever writes from a scheduler process: the writer (and its file) starts with
the first record, and only scheduler-side hooks produce records.

State (``State``): ``WAITING`` until the first record (or ``start``),
``RECORDING`` once its writer runs, ``OFF`` if the writer could not start
(nothing is recorded), ``CLOSED`` after ``close``, which happens once, from
whichever comes first: the end of the event loop, ``atexit``, or SIGTERM.

Per non-idle pass the hooks call ``begin_pass`` (a ``PassCapture``) and
``end_pass`` (hand it to the ``Emitter``); records raised inside a pass
(its KV allocations) wait in the capture and follow the pass's record, so
their ``pass_seq`` names the pass that caused them. Encoding and I/O happen
on the ``WriterThread``; rotation to a new part is the writer's too.

Pausing (``SCHEDTRACE_CONTROL_FILE``, control.py): the writer thread sets
``paused``; the scheduler thread reads that one attribute per non-idle pass
and per event. While paused, passes run uncaptured and events are dropped,
both counted; idle passes are still only counted. When the file says ``on``
again, ``paused`` becomes ``RESUMING`` and the scheduler thread's next pass
or event writes one ``Loss(reason="paused")`` with that count first. With a
control file the writer starts with the scheduler (``attach``), so the file
is watched from the start and read once before the first pass.

Ring mode: ``SIGUSR2`` asks the writer to write its window out; the handler
is installed in the scheduler process's main thread, and only if the signal
has no handler yet (sglang 0.5.23 installs none).
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedtrace.tracer.contract.names import (DEFAULT_MAX_BYTES, DEFAULT_QUEUE_SIZE, FINISH_REJECTED as REJECTED,
                                              LOSS_PAUSED, error_text)
from schedtrace.tracer.analysis.settings import MODULE_SETTINGS
from schedtrace.tracer.contract.names import SGLANG_TEST_RETRACT
from schedtrace.tracer.contract.prefix_ids import block_tokens
from schedtrace.tracer.contract.schema import Abort, Aiter, Finish, HookError, Loss, Record, Retract
from schedtrace.tracer.recorder import pools
from schedtrace.tracer.recorder.arrival import ArrivalCapture
from schedtrace.tracer.recorder.capture import PassCapture, SlotTally, finish_reason
from schedtrace.tracer.recorder.control import ControlFile
from schedtrace.tracer.recorder.emit import Emitter
from schedtrace.tracer.recorder.header import header_row
from schedtrace.tracer.recorder.lock_probe import LockProbe
from schedtrace.tracer.recorder.naming import ensure_prefix_key, trace_stem
from schedtrace.tracer.recorder.policy import WriterPolicy
from schedtrace.tracer.recorder.ranks import read_ranks
from schedtrace.tracer.recorder.rows import alloc_row
from schedtrace.tracer.recorder.writer_thread import Sink, WriterThread

logger = logging.getLogger(__name__)


class State(enum.Enum):
    WAITING = "waiting"  # no writer yet: it starts with the first record
    RECORDING = "recording"
    OFF = "off"  # the writer could not start: record nothing
    CLOSED = "closed"


RESUMING = "resuming"  # a truthy ``paused``: the control said on; the scheduler thread resumes next


class Recorder:
    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        sink_factory: Callable[[], list[Sink]] | None = None,
        flush_interval_s: float | None = None,
        policy: WriterPolicy | None = None,
        run_id: str = "",
        prefix_key: bytes | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.queue_size = queue_size
        self.flush_interval_s = flush_interval_s
        self.policy = policy or WriterPolicy()
        self.run_id = run_id
        # The prefix ids' secret: the run's (inherited, or published here for the ranks to inherit).
        self.prefix_key = prefix_key or ensure_prefix_key()
        self.prefix_block = 0  # tokens per prefix id, from the attached scheduler's page size
        self.counts_forwards = False  # sglang's SGLANG_TEST_RETRACT hook retracts by Scheduler.forward_ct
        # Scheduler thread reads it per non-idle pass and event; the control file's poll writes it.
        self.paused: bool | str = False
        self.skipped = 0  # passes and events not recorded while paused, not yet in a Loss record
        self._pause_flushed = False
        self._control = ControlFile(self.policy.control_file, self.set_recording) if self.policy.control_file else None
        self._sink_factory = sink_factory
        self._t0 = time.monotonic_ns()
        self._start_wall_ns = time.time_ns()
        self.state = State.WAITING
        self.scheduler: Any = None
        self.readers: pools.PoolReaders | None = None  # the attached scheduler's pools, from the first read
        self._writer: WriterThread | None = None
        self.emitter = Emitter(self.now, self.start)
        self.capture: PassCapture | None = None  # the pass running now, if any
        self.lock_probe = LockProbe()
        self._live_rids: set[str] = set()
        # The rid sglang ended inside _add_request_to_queue (rejected at --max-queued-requests),
        # before the arrival hook, which runs after it, wrote its arrival.
        self._ended_unqueued: str | None = None
        self.hook_errors: dict[str, int] = {}
        self._state_lock = threading.Lock()  # close() may race itself (atexit, SIGTERM, loop end)

    @property
    def writer(self) -> WriterThread | None:
        return self._writer

    # --- clock and lifecycle ---

    def now(self) -> int:
        return time.monotonic_ns() - self._t0

    def attach(self, scheduler: Any) -> None:
        """Remember the scheduler of this process (header and KV reads); the first one stays."""
        if self.scheduler is None:
            self.scheduler = scheduler
            self.prefix_block = block_tokens(int(getattr(scheduler, "page_size", 1) or 1))
            module, constant = MODULE_SETTINGS[SGLANG_TEST_RETRACT]
            self.counts_forwards = bool(getattr(sys.modules.get(module), constant, False))
            if self._control is not None and self.start() is not None:
                self._control.poll(force=True)  # off from the start: not one pass recorded

    def pool_readers(self) -> pools.PoolReaders:
        """The attached scheduler's count readers, resolved at the first read: one whose
        pools cannot be read raises here, in the hook that asked, and again at the next."""
        readers = self.readers
        if readers is None:
            readers = self.readers = pools.PoolReaders(self.scheduler)
            self.lock_probe.swa_evictable = readers.swa_evictable
        return readers

    def start(self, writer: WriterThread | None = None) -> WriterThread | None:
        """Start recording, into ``writer`` or a new writer for the attached scheduler.

        Returns the writer; None while no scheduler is attached, or when off.
        Once started (or off, or closed) it only returns what it has.
        """
        if self.state is not State.WAITING:
            return self._writer
        if writer is None:
            if self.scheduler is None:
                return None
            writer = self._open_writer()
            if writer is None:
                self.state = State.OFF
                return None
        self._writer = writer
        self.state = State.RECORDING
        return writer

    def _open_writer(self) -> WriterThread | None:
        scheduler = self.scheduler
        pid = os.getpid()
        run_id = self.run_id

        def make_header(part: int, first_pass: int):
            return header_row(scheduler, pid, self._start_wall_ns, part, first_pass, run_id)

        try:
            sinks = self._sink_factory() if self._sink_factory else []
            kwargs = {} if self.flush_interval_s is None else {"flush_interval_s": self.flush_interval_s}
            writer = WriterThread(
                self.directory, trace_stem(run_id, read_ranks(scheduler), pid), make_header, clock_ns=self.now,
                queue_size=self.queue_size, max_bytes=self.max_bytes, sinks=sinks, policy=self.policy,
                on_tick=self._control.poll if self._control is not None else None, **kwargs,
            )
        except Exception as exc:  # one line: the cause is the directory or the disk, not a bug to trace back
            logger.error("schedtrace: cannot start the trace writer in %s (%s); recording is off",
                         self.directory, error_text(exc))
            return None
        if writer.ring is not None:
            logger.info("schedtrace: ring mode: keeping the last %d bytes of scheduler decisions in memory; "
                        "a stall, a failed allocation, a pass error or SIGUSR2 writes them to %s",
                        writer.ring.capacity, self.directory)
        else:
            logger.info("schedtrace: recording scheduler decisions to %s", writer.paths[0])
        return writer

    def flush(self) -> None:
        """Queue on the writer what is held back (a rejected pass kept for folding, idle counts)."""
        self.emitter.flush()

    def close(self) -> None:
        """Write everything held, the hook error totals and the footer; stop the writer. Once."""
        with self._state_lock:
            if self.state is State.CLOSED:
                return
            previous, self.state = self.state, State.CLOSED
        if previous is State.WAITING and self.scheduler is not None:
            self._writer = self._open_writer()  # an idle-only run still leaves a trace
        writer = self._writer
        if writer is None:
            return
        if self.skipped:  # straight to the emitter: the control file may still say off
            self.emitter.emit(Loss(self.now(), self.skipped, LOSS_PAUSED))
            self.skipped = 0
        self.emitter.flush()
        for hook, count in sorted(self.hook_errors.items()):
            if count > 1:
                writer.submit(HookError(self.now(), hook, f"{count} failures in total", count))
        writer.extra_counts["hook_errors"] = sum(self.hook_errors.values())
        writer.close()

    def close_at_exit(self) -> None:
        """Scheduler process: close at interpreter exit, and on a plain SIGTERM (which skips atexit)."""
        import atexit
        import signal

        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            owner = os.getpid()

            def on_sigterm(signum, frame):
                try:
                    if os.getpid() == owner:  # a forked child has no writer thread to close
                        self.close()
                finally:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_sigterm)
        if self.policy.ring:
            self._install_dump_signal()

    def _install_dump_signal(self) -> None:
        import signal

        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGUSR2)
        if current is not signal.SIG_DFL:
            logger.warning("schedtrace: SIGUSR2 already has a handler (%r); ring mode writes its window "
                           "only on its own triggers", current)
            return

        def on_sigusr2(signum, frame):
            writer = self._writer
            if writer is not None and writer.triggers is not None:
                writer.triggers.request()

        signal.signal(signal.SIGUSR2, on_sigusr2)

    # --- pausing ---

    def set_recording(self, on: bool) -> None:
        """The control file's state (writer thread, every poll): pause, or resume at the next pass or event."""
        paused = self.paused
        if not on and paused is False:
            self.paused = True
        elif on and paused is True:
            self.paused = RESUMING

    def _skip(self) -> bool:
        """Scheduler thread, ``paused`` set: True to skip (and count) this pass or event; False once resumed."""
        if self.paused is RESUMING:
            self.paused = False
            self._pause_flushed = False
            if self.skipped:  # straight to the emitter: the control file may already say off again
                self.emitter.emit(Loss(self.now(), self.skipped, LOSS_PAUSED))
                self.skipped = 0
            return False
        if not self._pause_flushed:  # what is held from before the pause goes out first, in time order
            self._pause_flushed = True
            self.emitter.flush()
        self.skipped += 1
        return True

    # --- emitting ---

    def emit(self, record: Record | tuple) -> None:
        """Queue one event record (or a deferred call, writer_thread.py) in time order; inside a
        pass, after that pass's record."""
        if self.paused and self._skip():
            return
        self._queue(record)

    def _queue(self, record: Record | tuple) -> None:
        """``emit`` once the pause is checked: the one rule for where an event goes."""
        cap = self.capture
        if cap is not None:
            cap.events.append(record)
        else:
            self.emitter.emit(record)

    def hook_failed(self, hook: str, exc: BaseException) -> None:
        """Count a hook failure; the first of each hook is logged and written as a ``HookError``."""
        count = self.hook_errors.get(hook, 0) + 1
        self.hook_errors[hook] = count
        if count == 1:
            logger.warning("schedtrace: recorder hook %s failed (sglang is unaffected): %r", hook, exc)
            try:
                self.emit(HookError(self.now(), hook, error_text(exc)))
            except Exception:  # the writer itself is what failed: nothing more to do
                pass

    # --- pass ---

    def begin_pass(self, scheduler: Any, running_batch: Any) -> PassCapture | None:
        """The capture of this pass; None while paused (the pass runs unrecorded)."""
        if self.paused and self._skip():
            return None
        if self.scheduler is None:
            self.attach(scheduler)
        if scheduler is self.scheduler:
            readers = self.readers or self.pool_readers()
        else:
            readers = pools.PoolReaders(scheduler)
        cap = PassCapture(scheduler, running_batch, self.now(), readers)
        if self.counts_forwards:
            cap.forward_ct = scheduler.forward_ct
        self.capture = cap
        return cap

    def end_pass(self, scheduler: Any, cap: PassCapture | None, result: Any, error: BaseException | None) -> None:
        if cap is None:
            return
        self.capture = None
        foldable = cap.close(scheduler, result, error, self.now())
        self.emitter.emit_pass(cap, foldable, cap.fold_key() if foldable else None, cap.events)

    def abandon_pass(self) -> None:
        """The capture failed: the pass runs unrecorded and its events go out on their own."""
        self.capture = None

    # --- events ---

    def on_arrival(self, req: Any, is_retracted: bool) -> None:
        if self.paused and self._skip():  # before the rid is known: its finish is not written either
            return
        rid = req.rid
        if is_retracted:
            self.emit(Retract(self.now(), rid, len(req.output_ids)))
            return
        if rid in self._live_rids:  # requeued after preemption: not a new arrival
            return
        now = self.now()
        self.emit(ArrivalCapture(now, req, self.prefix_key, self.prefix_block,
                                 getattr(req, "arrival_processed_tokens", None)))
        if self._ended_unqueued == rid:  # rejected: it arrived and left at once, never queued
            self._ended_unqueued = None
            self.emit(Finish(now, rid, 0, REJECTED))
        else:
            self._live_rids.add(rid)

    def on_finish(self, req: Any, reason: str | None = None) -> None:
        rid = req.rid
        if rid not in self._live_rids:
            self._ended_unqueued = rid  # ended before its arrival was written: the arrival closes it
            return
        self._live_rids.discard(rid)
        self.emit(Finish(self.now(), rid, len(req.output_ids), reason or finish_reason(req)))

    def on_abort(self, rid: str) -> None:
        self.emit(Abort(self.now(), rid))

    def on_alloc(self, op: str, requested: Any, available: Any, ok: bool) -> None:
        """One outermost KV allocation, one or more per admitting pass: only the reads happen
        here. The writer thread makes the ``Alloc`` (``rows.alloc_row``) of the time, these,
        and the evictable count, queued as one tuple."""
        cap, readers = self.capture, self.readers
        if cap is not None and readers is not None:  # in a recorded pass: _queue's rule, one call less
            cap.events.append((alloc_row, self.now(), op, requested, available, readers.evictable(), ok))
            return
        if self.paused and self._skip():
            return
        evictable = (readers or self.pool_readers()).evictable() if self.scheduler is not None else 0
        self._queue((alloc_row, self.now(), op, requested, available, evictable, ok))

    def open_slots(self, free_slots: Any) -> SlotTally:
        """A tally of mamba state slots from ``free_slots`` (the free list before the first):
        in a recorded pass the pass's, queued with its events now and written after it;
        outside one the caller's, to hand to ``close_slots`` when its slots are counted."""
        tally = SlotTally(self.now(), free_slots)
        cap = self.capture
        if cap is not None:
            cap.slots = tally
            cap.events.append(tally)
        return tally

    def close_slots(self, tally: SlotTally) -> None:
        if self.paused and self._skip():
            return
        self._queue(tally)

    def slot_refused(self, tally: SlotTally) -> None:
        """A slot of ``tally`` was refused: from now on it is not all granted, and its
        ``evictable`` is the tree's evictable state slots now (rare: read only here)."""
        if tally.granted:
            tally.granted = False
            read = self.pool_readers().mamba_evictable if self.scheduler is not None else None
            tally.evictable = read() if read is not None else 0

    def on_aiter(self, record: Aiter) -> None:
        self.emit(record)
