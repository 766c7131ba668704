"""The recorder: hooks that turn one scheduler's decisions into trace records.

One ``Recorder`` lives in each sglang process that loads the plugin, but it
only ever writes from a scheduler process: the writer (and its file) is
created on the first record, which only scheduler-side hooks produce.

Per pass (``Scheduler._get_new_batch_prefill_raw``):

* idle check first (empty waiting queue and no chunked request): bump a
  counter and call through; nothing else runs;
* otherwise open a ``_PassCapture``: references to the live requests plus
  the few ints that can change (``schedtrace.tracer.recorder.capture`` says which), filled by
  the ``PrefillAdder``/``PrefillBudget`` hooks while the pass runs (``error``
  if it raised; the exception is re-raised unchanged). The ``Pass`` record
  itself is built on the writer thread (``WriterThread`` builds ``Deferred``s),
  and so are its ``Candidate``/``Admitted`` rows: the hooks keep tuples of
  the request and the ints read at the time. While a candidate with a
  prefix match is added, ``LockProbe`` (a hook on the tree caches' ``lock``)
  measures what pinning that prefix took from the evictable count
  (``Candidate.locked_evictable``);
* a rejected pass (nothing admitted, no chunk) is held back; identical
  rejected passes that follow within ``FOLD_WINDOW_NS`` with no record in
  between fold into it (``repeat`` += 1, ``dur_ns`` summed), compared by a
  fingerprint of the capture (request identities + captured ints + flags),
  so a folded repeat builds nothing at all.

Every record goes through ``_emit``, which first writes the held pass and an
``Idle`` record for idle passes counted since the previous record, so the
file keeps time order. Encoding and I/O happen on ``WriterThread``.

Hook failures never reach sglang: each is caught, counted, logged once per
hook and written as a ``HookError``; the sglang function runs regardless and
its result is returned unchanged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schedtrace.tracer.recorder import capture as snapshot
from schedtrace.tracer.recorder import pools
from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS, LockProbe
from schedtrace.tracer.contract.schema import (
    Abort,
    Admitted,
    Aiter,
    Alloc,
    Arrival,
    Candidate,
    ChunkOutcome,
    Finish,
    HookError,
    Idle,
    Pass,
    Record,
    Retract,
)
from schedtrace.tracer.recorder.writer_thread import DEFAULT_MAX_BYTES, DEFAULT_QUEUE_SIZE, Deferred, Sink, WriterThread

logger = logging.getLogger(__name__)

# A held rejected pass is written at the latest this long after it started,
# so a scheduler stuck in identical passes still shows up in the file.
FOLD_WINDOW_NS = 100_000_000


class _PassCapture(Deferred):
    """What one non-idle pass saw, cheap to take; the writer thread builds the ``Pass``.

    On the scheduler thread: references to the live ``Req`` objects (copied
    lists, since sglang sorts and filters its own in place), the ints that can
    change per request (``prefix_len``, ``len(output_ids)``), the KV counts and
    flags. ``build()`` later adds the fields that never change once a request
    is queued (``schedtrace.tracer.recorder.capture`` lists them). Filled by the adder/budget
    hooks while the pass runs; never touched by the scheduler thread once
    submitted.
    """

    __slots__ = (
        "t_ns", "dur_ns", "repeat", "idle_before",
        "waiting", "waiting_prefix", "waiting_out", "running", "running_out",
        "chunked", "chunked_prefix", "chunked_out", "batch_is_full_in",
        "kv", "req_slots_free", "new_token_ratio", "chunked_prefill_size",
        "candidates", "admitted", "chunk", "new_chunked_rid", "batch_is_full_out", "error",
        "in_chunk", "budget", "events",
    )

    def __init__(self) -> None:
        self.dur_ns = 0
        self.repeat = 1
        self.idle_before = 0
        # (req, prefix_len, extend_len, AddReqResult, locked_evictable) per add_one_req call
        self.candidates: list[tuple] = []
        # (req, prefix_len, extend_len) per admitted request, the continuing chunk first
        self.admitted: list[tuple] = []
        self.chunk: ChunkOutcome | None = None
        self.new_chunked_rid: str | None = None
        self.batch_is_full_out = False
        self.error: str | None = None
        self.in_chunk = False
        self.budget: int | None = None
        self.events: list[Record] = []  # emitted during the pass: written after it

    def fold_key(self) -> tuple:
        """Equal keys <=> equal ``Pass`` records but for timing. ``Req`` has no
        ``__eq__``, so its lists compare by identity; the held pass keeps them alive."""
        return (
            self.waiting, self.waiting_prefix, self.waiting_out, self.running, self.running_out,
            self.chunked, self.chunked_prefix, self.chunked_out, self.batch_is_full_in, self.kv,
            self.req_slots_free, self.new_token_ratio, self.chunked_prefill_size,
            self.candidates, self.batch_is_full_out, self.error,
        )

    def candidate_rows(self) -> list[Candidate]:
        return [
            Candidate(req.rid, prefix_len, extend_len, getattr(result, "name", str(result)), drop)
            for req, prefix_len, extend_len, result, drop in self.candidates
        ]

    def admitted_rows(self) -> list[Admitted]:
        return [Admitted(req.rid, prefix_len, extend_len) for req, prefix_len, extend_len in self.admitted]

    def build(self) -> Pass:
        chunked = self.chunked
        return Pass(
            0, self.t_ns, self.dur_ns, self.repeat, self.idle_before,
            snapshot.waiting_rows(self.waiting, self.waiting_prefix, self.waiting_out),
            snapshot.running_rows(self.running, self.running_out),
            snapshot.chunked_row(chunked, self.chunked_prefix, self.chunked_out) if chunked is not None else None,
            self.batch_is_full_in, pools.kv_row(self.kv), self.req_slots_free, self.new_token_ratio,
            self.chunked_prefill_size, self.candidate_rows(), self.admitted_rows(), self.chunk, self.new_chunked_rid,
            self.batch_is_full_out, self.error,
        )


class Recorder:
    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        sink_factory: Callable[[], list[Sink]] | None = None,
        flush_interval_s: float | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.queue_size = queue_size
        self.flush_interval_s = flush_interval_s
        self._sink_factory = sink_factory
        self._t0 = time.monotonic_ns()
        self._start_wall_ns = time.time_ns()
        self.scheduler: Any = None
        self.writer: WriterThread | None = None
        self.disabled = False  # the writer could not be created: record nothing
        self.idle = 0  # idle passes since the previous record
        self.idle_total = 0  # folded into idle records as they are written
        self.capture: _PassCapture | None = None
        self._held: Pass | _PassCapture | None = None
        self._held_key: tuple | None = None
        self._in_alloc = False
        self.lock_probe = LockProbe()
        self._live_rids: set[str] = set()
        self.hook_errors: dict[str, int] = {}
        self._closed = False
        self._close_lock = threading.Lock()

    # --- clock and lifecycle ---

    def now(self) -> int:
        return time.monotonic_ns() - self._t0

    def attach(self, scheduler: Any) -> None:
        """Remember the scheduler of this process (header and KV reads)."""
        if self.scheduler is None:
            self.scheduler = scheduler

    def _ensure_writer(self) -> WriterThread | None:
        if self.writer is not None or self.disabled:
            return self.writer
        scheduler = self.scheduler
        if scheduler is None:
            return None
        pid = os.getpid()
        tp_rank, dp_rank = snapshot.scheduler_ranks(scheduler)
        stem = f"schedtrace-tp{tp_rank}-dp{dp_rank or 0}-pid{pid}"

        def make_header(part: int, first_pass: int):
            return snapshot.header_row(scheduler, pid, self._start_wall_ns, part, first_pass)

        try:
            sinks = self._sink_factory() if self._sink_factory else []
            kwargs = {} if self.flush_interval_s is None else {"flush_interval_s": self.flush_interval_s}
            self.writer = WriterThread(
                self.directory, stem, make_header, clock_ns=self.now,
                queue_size=self.queue_size, max_bytes=self.max_bytes, sinks=sinks, **kwargs,
            )
        except Exception:
            self.disabled = True
            logger.exception("schedtrace: cannot start the trace writer in %s; recording is off", self.directory)
            return None
        logger.info("schedtrace: recording scheduler decisions to %s", self.writer.paths[0])
        return self.writer

    def close(self) -> None:
        """Write everything held, the footer, and stop the writer. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self.writer is None and self.scheduler is not None and not self.disabled:
            self._ensure_writer()  # an idle-only run still leaves a trace
        writer = self.writer
        if writer is None:
            return
        self._flush_held()
        if self.idle:
            self._submit_idle()
        for hook, count in sorted(self.hook_errors.items()):
            if count > 1:
                writer.submit(HookError(self.now(), hook, f"{count} failures in total", count))
        writer.extra_counts["hook_errors"] = sum(self.hook_errors.values())
        writer.close()

    # --- emitting ---

    def _submit_idle(self) -> None:
        self.writer.submit(Idle(self.now(), self.idle))
        self.idle_total += self.idle
        self.idle = 0

    def _flush_held(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._held_key = None
            self.writer.submit(held)

    def _emit(self, record: Record) -> None:
        """Queue one event record in time order (after the held pass and idles).

        Events raised inside a pass (its KV allocations) follow that pass's
        record, so their ``pass_seq`` names the pass that caused them.
        """
        cap = self.capture
        if cap is not None:
            cap.events.append(record)
            return
        writer = self.writer or self._ensure_writer()
        if writer is None:
            return
        if self._held is not None:
            self._flush_held()
        if self.idle:
            self._submit_idle()
        writer.submit(record)

    def _emit_pass(self, record: Pass | _PassCapture, foldable: bool, key: tuple | None) -> None:
        """Write a pass, or hold a foldable (rejected) one to fold its repeats into.

        Folding compares ``key`` only, before anything is built: a held
        capture's ``repeat`` and ``dur_ns`` grow; it is built once, when written.
        """
        writer = self.writer or self._ensure_writer()
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
            self._flush_held()
        if self.idle:
            record.idle_before = self.idle
            self._submit_idle()
        if foldable:
            self._held = record
            self._held_key = key
        else:
            writer.submit(record)

    def hook_failed(self, hook: str, exc: BaseException) -> None:
        count = self.hook_errors.get(hook, 0) + 1
        self.hook_errors[hook] = count
        if count == 1:
            logger.warning("schedtrace: recorder hook %s failed (sglang is unaffected): %r", hook, exc)
            try:
                self._emit(HookError(self.now(), hook, f"{type(exc).__name__}: {exc}"[:500]))
            except Exception:  # the writer itself is what failed: nothing more to do
                pass

    # --- pass ---

    def begin_pass(self, scheduler: Any, running_batch: Any) -> _PassCapture:
        if self.scheduler is None:
            self.attach(scheduler)
        cap = _PassCapture()
        cap.t_ns = self.now()
        waiting = list(scheduler.waiting_queue)
        cap.waiting = waiting
        cap.waiting_prefix = snapshot.prefix_lens(waiting)
        cap.waiting_out = snapshot.output_lens(waiting)
        if running_batch is not None:
            running = list(running_batch.reqs)
            cap.batch_is_full_in = bool(running_batch.batch_is_full)
        else:
            running = []
            cap.batch_is_full_in = False
        cap.running = running
        cap.running_out = snapshot.output_lens(running)
        chunked = scheduler.chunked_req
        cap.chunked = chunked
        if chunked is not None:
            cap.chunked_prefix = chunked.prefix_len
            cap.chunked_out = len(chunked.output_ids)
        else:
            cap.chunked_prefix = cap.chunked_out = 0
        cap.kv = pools.kv_counts(scheduler)
        cap.req_slots_free = scheduler.req_to_token_pool.available_size()
        cap.new_token_ratio = float(scheduler.new_token_ratio_tracker.current)
        cap.chunked_prefill_size = snapshot.effective_chunk_size(scheduler)
        self.capture = cap
        return cap

    def end_pass(self, scheduler: Any, cap: _PassCapture, result: Any, error: BaseException | None) -> None:
        self.capture = None
        cap.dur_ns = self.now() - cap.t_ns
        new_chunked = scheduler.chunked_req
        if new_chunked is not None and new_chunked is not cap.chunked:
            cap.new_chunked_rid = new_chunked.rid
        if isinstance(result, tuple) and len(result) == 2 and result[1] is not None:
            cap.batch_is_full_out = bool(result[1].batch_is_full)
        if error is not None:
            cap.error = f"{type(error).__name__}: {error}"[:500]
        foldable = not cap.admitted and cap.chunk is None and cap.new_chunked_rid is None and not cap.events
        self._emit_pass(cap, foldable, cap.fold_key() if foldable else None)
        for event in cap.events:
            self._emit(event)

    # --- events ---

    def on_arrival(self, req: Any, is_retracted: bool) -> None:
        rid = req.rid
        if is_retracted:
            self._emit(Retract(self.now(), rid, len(req.output_ids)))
            return
        if rid in self._live_rids:  # requeued after preemption: not a new arrival
            return
        self._live_rids.add(rid)
        params = req.sampling_params
        self._emit(Arrival(
            self.now(), rid, len(req.origin_input_ids), params.max_new_tokens,
            req.priority, bool(params.ignore_eos),
        ))

    def on_finish(self, req: Any, reason: str | None = None) -> None:
        rid = req.rid
        if rid not in self._live_rids:
            return
        self._live_rids.discard(rid)
        self._emit(Finish(self.now(), rid, len(req.output_ids), reason or snapshot.finish_reason(req)))

    def on_abort(self, rid: str) -> None:
        self._emit(Abort(self.now(), rid))

    def on_alloc(self, op: str, requested: int, available: int, ok: bool) -> None:
        scheduler = self.scheduler
        evictable = pools.evictable_tokens(scheduler) if scheduler is not None else 0
        self._emit(Alloc(self.now(), -1, op, int(requested), int(available), int(evictable), ok))

    def on_aiter(self, record: Aiter) -> None:
        self._emit(record)


# --- hooks ------------------------------------------------------------------

SCHED = "sglang.srt.managers.scheduler.Scheduler"
ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
BUDGET_MODULE = "sglang.srt.mem_cache.prefill_budget"
ALLOC_MODULE = "sglang.srt.mem_cache.allocator"
AITER_TARGET = "sglang.srt.models.deepseek_common.attention_backend_handler.handle_attention_aiter"

# Allocator classes whose own methods the scheduler calls (page_size 1 ->
# TokenToKVPoolAllocator.alloc; paged -> alloc_extend/alloc_decode; SWA pools).
ALLOCATOR_METHODS: tuple[tuple[str, str], ...] = (
    ("token.TokenToKVPoolAllocator", "alloc"),
    ("paged.PagedTokenToKVPoolAllocator", "alloc"),
    ("paged.PagedTokenToKVPoolAllocator", "alloc_extend"),
    ("paged.PagedTokenToKVPoolAllocator", "alloc_decode"),
    ("swa.SWATokenToKVPoolAllocator", "alloc"),
    ("swa.SWATokenToKVPoolAllocator", "alloc_extend"),
    ("swa.SWATokenToKVPoolAllocator", "alloc_decode"),
)
BUDGET_CLASSES = ("PrefillBudget", "SWAPrefillBudget", "SharedSWAPrefillBudget")


def make_hooks(rec: Recorder) -> list[tuple[str, Callable[..., Any]]]:
    """(dotted target, AROUND hook) pairs for every hook point of ``rec``."""
    hook_failed = rec.hook_failed
    probe = rec.lock_probe

    def pass_hook(original, scheduler, *args, **kwargs):
        # Idle check first: most passes are idle and must cost next to nothing.
        if not scheduler.waiting_queue and scheduler.chunked_req is None:
            rec.idle += 1
            return original(scheduler, *args, **kwargs)
        try:
            running_batch = kwargs["running_batch"] if "running_batch" in kwargs else args[1]
            cap = rec.begin_pass(scheduler, running_batch)
        except Exception as exc:
            rec.capture = None
            hook_failed("pass", exc)
            return original(scheduler, *args, **kwargs)
        try:
            result = original(scheduler, *args, **kwargs)
        except BaseException as exc:
            try:
                rec.end_pass(scheduler, cap, None, exc)
            except Exception as hook_exc:
                hook_failed("pass", hook_exc)
            raise
        try:
            rec.end_pass(scheduler, cap, result, None)
        except Exception as exc:
            rec.capture = None
            hook_failed("pass", exc)
        return result

    def add_one_req_hook(original, adder, req, *args, **kwargs):
        cap = rec.capture
        if cap is None:
            return original(adder, req, *args, **kwargs)
        try:
            run_list = adder.can_run_list
            before = len(run_list)
            prefix_len = req.prefix_len
            # The pin on the candidate's prefix moves only its not-yet-locked part out
            # of the evictable budget; replay needs that amount (Candidate.locked_evictable).
            # An empty match pins the root, which is never evictable: nothing to measure.
            if prefix_len:
                probe.arm()
        except Exception as exc:
            probe.disarm()
            hook_failed("add_one_req", exc)
            return original(adder, req, *args, **kwargs)
        try:
            result = original(adder, req, *args, **kwargs)
        finally:
            drop = probe.disarm() if prefix_len else 0
        try:
            # Tuples here; the writer thread makes the rows (_PassCapture.candidate_rows).
            if len(run_list) > before and run_list[-1] is req:
                admitted = (req, req.prefix_len, req.extend_len)
                cap.admitted.append(admitted)
                cap.candidates.append((*admitted, result, drop))
            else:
                cap.candidates.append((req, prefix_len, 0, result, drop))
            if probe.error is not None:
                error, probe.error = probe.error, None
                hook_failed("lock_probe", error)
        except Exception as exc:
            hook_failed("add_one_req", exc)
        return result

    def add_chunked_req_hook(original, adder, req, *args, **kwargs):
        cap = rec.capture
        if cap is None:
            return original(adder, req, *args, **kwargs)
        try:
            before = len(adder.can_run_list)
            cap.in_chunk = True
            cap.budget = None
        except Exception as exc:
            hook_failed("add_chunked_req", exc)
            return original(adder, req, *args, **kwargs)
        try:
            result = original(adder, req, *args, **kwargs)
        finally:
            cap.in_chunk = False
        try:
            run_list = adder.can_run_list
            ran = len(run_list) > before and run_list[-1] is req
            size = req.extend_len if ran else None
            cap.chunk = ChunkOutcome(req.rid, cap.budget, size)
            if ran:
                cap.admitted.append((req, req.prefix_len, size))
        except Exception as exc:
            hook_failed("add_chunked_req", exc)
        return result

    def chunk_budget_hook(original, budget, *args, **kwargs):
        result = original(budget, *args, **kwargs)
        cap = rec.capture
        if cap is not None and cap.in_chunk:
            cap.budget = result  # nested super() calls: the outermost result lands last
        return result

    def make_alloc_hook(op: str, requested_of: Callable[[tuple, dict], int]):
        def alloc_hook(original, allocator, *args, **kwargs):
            if rec._in_alloc:  # composite allocators call their sub-allocators
                return original(allocator, *args, **kwargs)
            try:
                requested = requested_of(args, kwargs)
                available = allocator.available_size()
            except Exception as exc:
                hook_failed(op, exc)
                return original(allocator, *args, **kwargs)
            rec._in_alloc = True
            try:
                result = original(allocator, *args, **kwargs)
            finally:
                rec._in_alloc = False
            try:
                rec.on_alloc(op, requested, available, result is not None)
            except Exception as exc:
                hook_failed(op, exc)
            return result

        return alloc_hook

    def _arg(args: tuple, kwargs: dict, index: int, name: str) -> Any:
        return kwargs[name] if name in kwargs else args[index]

    alloc_requested = {
        "alloc": lambda a, k: _arg(a, k, 0, "need_size"),
        "alloc_extend": lambda a, k: _arg(a, k, 5, "extend_num_tokens"),
        "alloc_decode": lambda a, k: len(_arg(a, k, 0, "seq_lens")),
    }

    def init_hook(original, scheduler, *args, **kwargs):
        result = original(scheduler, *args, **kwargs)
        try:
            rec.attach(scheduler)
            on_scheduler_ready(rec)
        except Exception as exc:
            hook_failed("scheduler_init", exc)
        return result

    def event_loop_hook(original, scheduler, *args, **kwargs):
        try:
            return original(scheduler, *args, **kwargs)
        finally:
            try:
                rec.close()
            except Exception as exc:
                logger.warning("schedtrace: closing the trace failed: %r", exc)

    def add_to_queue_hook(original, scheduler, req, *args, **kwargs):
        result = original(scheduler, req, *args, **kwargs)
        try:
            if rec.scheduler is None:
                rec.attach(scheduler)
            is_retracted = kwargs["is_retracted"] if "is_retracted" in kwargs else (args[0] if args else False)
            rec.on_arrival(req, bool(is_retracted))
        except Exception as exc:
            hook_failed("arrival", exc)
        return result

    def stream_output_hook(original, streamer, reqs, *args, **kwargs):
        try:
            finishing = [r for r in reqs if r.finished_reason is not None and not r.finished_output]
        except Exception as exc:
            hook_failed("finish", exc)
            return original(streamer, reqs, *args, **kwargs)
        result = original(streamer, reqs, *args, **kwargs)
        if finishing:
            try:
                for req in finishing:
                    if req.finished_output:
                        rec.on_finish(req)
            except Exception as exc:
                hook_failed("finish", exc)
        return result

    def send_abort_output_hook(original, scheduler, abort_req, req, *args, **kwargs):
        result = original(scheduler, abort_req, req, *args, **kwargs)
        try:
            rec.on_finish(req, "abort")
        except Exception as exc:
            hook_failed("finish", exc)
        return result

    def abort_request_hook(original, scheduler, recv_req, *args, **kwargs):
        try:
            rid = recv_req.rid if not getattr(recv_req, "abort_all", False) else "*"
            rec.on_abort(str(rid))
        except Exception as exc:
            hook_failed("abort", exc)
        return original(scheduler, recv_req, *args, **kwargs)

    def aiter_hook(original, attn, forward_batch, *args, **kwargs):
        method = original(attn, forward_batch, *args, **kwargs)
        try:
            rec.on_aiter(aiter_record(rec.now(), forward_batch, method))
        except Exception as exc:
            hook_failed("aiter", exc)
        return method

    hooks: list[tuple[str, Callable[..., Any]]] = [
        (f"{SCHED}._get_new_batch_prefill_raw", pass_hook),
        (f"{SCHED}.__init__", init_hook),
        (f"{SCHED}.run_event_loop", event_loop_hook),
        (f"{SCHED}._add_request_to_queue", add_to_queue_hook),
        (f"{SCHED}.send_abort_output", send_abort_output_hook),
        (f"{SCHED}.abort_request", abort_request_hook),
        ("sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer.stream_output", stream_output_hook),
        (f"{ADDER}.add_one_req", add_one_req_hook),
        (f"{ADDER}.add_chunked_req", add_chunked_req_hook),
        *[(f"{BUDGET_MODULE}.{cls}.available_chunk_tokens", chunk_budget_hook) for cls in BUDGET_CLASSES],
        *[
            (f"{ALLOC_MODULE}.{cls}.{method}", make_alloc_hook(method, alloc_requested[method]))
            for cls, method in ALLOCATOR_METHODS
        ],
        (AITER_TARGET, aiter_hook),
        *[(target, probe.hook) for target in LOCK_TARGETS],
    ]
    return hooks


def aiter_record(t_ns: int, forward_batch: Any, method: Any) -> Aiter:
    """The inputs ``handle_attention_aiter`` decided on, and what it chose."""
    import sglang.srt.models.deepseek_common.attention_backend_handler as handler

    seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    seq_lens_sum = int(sum(seq_lens_cpu)) if seq_lens_cpu is not None else int(getattr(forward_batch, "seq_lens_sum", 0) or 0)
    return Aiter(
        t_ns,
        getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode)),
        seq_lens_sum,
        int(forward_batch.get_max_chunk_capacity()),
        bool(handler.is_in_tc_piecewise_cuda_graph()),
        bool(handler.is_in_breakable_cuda_graph()),
        getattr(method, "name", str(method)),
    )


def on_scheduler_ready(rec: Recorder) -> None:
    """Scheduler process only: route the aiter registry to the hook, close at exit."""
    import atexit
    import signal
    import sys

    handler = sys.modules.get("sglang.srt.models.deepseek_common.attention_backend_handler")
    if handler is not None:
        # The registry captured the function at import; point it at the wrapper.
        wrapped = handler.handle_attention_aiter
        registry = handler.AttentionBackendRegistry._handlers
        for name, fn in list(registry.items()):
            if fn is not wrapped and fn is getattr(wrapped, "__wrapped__", None):
                registry[name] = wrapped
    atexit.register(rec.close)
    # A plain SIGTERM (how servers are stopped) would skip atexit: close first.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def on_sigterm(signum, frame):
            try:
                rec.close()
            finally:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)
