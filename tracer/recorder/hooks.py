"""Every hook point of the recorder: the (dotted target, AROUND hook) pairs ``make_hooks`` returns.

The hooks run on sglang's scheduler thread, the pass hook on every pass:

* the pass (``Scheduler._get_new_batch_prefill_raw``): the idle check comes
  first (empty waiting queue, no chunked request): one counter increment,
  then the call through; otherwise a ``PassCapture`` from entry to exit;
* ``SchedulePolicy.calc_priority``: the order it left the queue in and, where
  it matched prefixes, each waiting request's match of this pass;
* ``ScheduleBatch.release_req`` inside a pass: a running request priority
  preemption released, and the free and evictable counts it left;
* ``ScheduleBatch.init_new``: admission is over; the running batch's flag
  then is ``Pass.batch_is_full_out`` (the replay stops there too);
* ``PrefillAdder.add_one_req`` / ``add_chunked_req`` and the budgets'
  ``available_chunk_tokens``: each candidate and the continuing chunk, into
  the running capture. While a candidate with a prefix match is added,
  ``LockProbe`` (a hook on the tree caches' ``inc_lock_ref``) keeps what
  pinning that prefix took from the evictable counts (``Candidate.locked_evictable``,
  and on an SWA tree ``locked_swa_evictable``);
* the KV allocators: one ``Alloc`` per outermost allocation; the mamba
  state slots (``MambaSlotAllocator.alloc``) one per pass, and outside a
  pass one per request-row binding (``HybridReqToTokenPool.alloc``) or call;
* requests arriving, finishing and aborted; ``handle_attention_aiter``;
* the scheduler's ``__init__`` and ``run_event_loop``: the lifecycle.

Hook failures never reach sglang: each is caught and handed to
``Recorder.hook_failed``; the sglang function runs regardless and its result
is returned unchanged (its exception re-raised unchanged).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from schedtrace.tracer.contract.schema import Aiter
from schedtrace.tracer.recorder.capture import SlotTally
from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS
from schedtrace.tracer.recorder.rows import MAMBA_ALLOC

logger = logging.getLogger(__name__)

Hook = Callable[..., Any]

SCHED = "sglang.srt.managers.scheduler.Scheduler"
ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
BUDGET_MODULE = "sglang.srt.mem_cache.prefill_budget"
ALLOC_MODULE = "sglang.srt.mem_cache.allocator"
AITER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
AITER_TARGET = f"{AITER_MODULE}.handle_attention_aiter"
STREAM_OUTPUT = "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer.stream_output"

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
    ("swa.SWATokenToKVPoolAllocator", "alloc_extend_swa_tail"),
    # The mamba state slots of a HybridReqToTokenPool (a request's state, its tracking buffers).
    ("mamba.MambaSlotAllocator", "alloc"),
)
BUDGET_CLASSES = ("PrefillBudget", "SWAPrefillBudget", "SharedSWAPrefillBudget")

PASS_TARGET = f"{SCHED}._get_new_batch_prefill_raw"
CALC_PRIORITY_TARGET = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
INIT_NEW_TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.init_new"
RELEASE_TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.release_req"
ADD_ONE_REQ_TARGET = f"{ADDER}.add_one_req"
ADD_CHUNKED_REQ_TARGET = f"{ADDER}.add_chunked_req"
BUDGET_TARGETS = tuple(f"{BUDGET_MODULE}.{cls}.available_chunk_tokens" for cls in BUDGET_CLASSES)
ALLOC_TARGETS = tuple(f"{ALLOC_MODULE}.{cls}.{method}" for cls, method in ALLOCATOR_METHODS)
# Binding request rows: the state slots of a batch's new requests, one ``mamba_alloc`` for the call.
MAMBA_ROWS_TARGET = "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.alloc"

# Every hook point one scheduling pass runs through (the bench and the tests drive these; not
# ``INIT_NEW_TARGET``, which they swap for a stand-in that builds no batch).
PASS_TARGETS: tuple[str, ...] = (
    PASS_TARGET, CALC_PRIORITY_TARGET, RELEASE_TARGET, ADD_ONE_REQ_TARGET, ADD_CHUNKED_REQ_TARGET, *BUDGET_TARGETS, *ALLOC_TARGETS, MAMBA_ROWS_TARGET,
    *LOCK_TARGETS,
)


def _arg(index: int, name: str) -> Callable[[tuple, dict], Any]:
    """The reader of one call argument, passed by position or by name (one frame per read)."""
    return lambda args, kwargs: args[index] if len(args) > index else kwargs[name]


_extend_num_tokens = _arg(5, "extend_num_tokens")
_seq_lens = _arg(0, "seq_lens")

# How many tokens (or requests, for decode) each KV allocator method is asked for.
# (``MambaSlotAllocator.alloc``'s state slots: its hook reads ``need_size`` itself.)
ALLOC_REQUESTED: dict[str, Callable[[tuple, dict], int]] = {
    "alloc": _arg(0, "need_size"),
    "alloc_extend": _extend_num_tokens,
    "alloc_decode": lambda a, k: len(_seq_lens(a, k)),
    "alloc_extend_swa_tail": _extend_num_tokens,
}


def alloc_op(cls: str, method: str) -> str:
    """The ``Alloc.op`` an allocator method is written as: its name; mamba slots have their own."""
    return MAMBA_ALLOC if cls.startswith("mamba.") else method


def make_hooks(rec: Recorder) -> list[tuple[str, Hook]]:
    """(dotted target, AROUND hook) pairs for every hook point of ``rec``."""
    hook_failed = rec.hook_failed
    emitter = rec.emitter
    probe = rec.lock_probe
    on_alloc = rec.on_alloc
    in_alloc = False  # inside an allocator hook: composite allocators call their sub-allocators

    def pass_hook(original, scheduler, *args, **kwargs):
        # Idle check first: most passes are idle and must cost next to nothing.
        if not scheduler.waiting_queue and scheduler.chunked_req is None:
            emitter.idle += 1
            return original(scheduler, *args, **kwargs)
        try:
            running_batch = kwargs["running_batch"] if "running_batch" in kwargs else args[1]
            cap = rec.begin_pass(scheduler, running_batch)
        except Exception as exc:
            rec.abandon_pass()
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
            rec.abandon_pass()
            hook_failed("pass", exc)
        return result

    def calc_priority_hook(original, policy, waiting_queue, *args, **kwargs):
        result = original(policy, waiting_queue, *args, **kwargs)
        cap = rec.capture
        if cap is not None:
            try:
                cap.sorted(policy, waiting_queue)
            except Exception as exc:
                hook_failed("calc_priority", exc)
        return result

    def release_hook(original, batch, idx, *args, **kwargs):
        cap = rec.capture
        if cap is None:  # retraction in decode: its Retract record says it
            return original(batch, idx, *args, **kwargs)
        rid = batch.reqs[idx].rid
        result = original(batch, idx, *args, **kwargs)
        try:
            cap.release(rid, batch.token_to_kv_pool_allocator.available_size(), rec.pool_readers().evictable())
        except Exception as exc:
            hook_failed("release_req", exc)
        return result

    def init_new_hook(original, cls, *args, **kwargs):
        cap = rec.capture
        if cap is not None:
            try:
                cap.batch_built()
            except Exception as exc:
                hook_failed("init_new", exc)
        return original(cls, *args, **kwargs)

    def add_one_req_hook(original, adder, req, *args, **kwargs):
        cap = rec.capture
        if cap is None:
            return original(adder, req, *args, **kwargs)
        try:
            run_list = adder.can_run_list
            before = len(run_list)
            prefix_len = req.prefix_len
            # The pin on the candidate's prefix moves only its not-yet-locked part out
            # of the evictable budget; replay needs that amount (Candidate.locked_evictable,
            # and on SWA locked_swa_evictable).
            # An empty match pins the root, which is never evictable: nothing to measure.
            if prefix_len:
                probe.drop = probe.swa_drop = None
                probe.armed = True
        except Exception as exc:
            probe.armed = False
            hook_failed("add_one_req", exc)
            return original(adder, req, *args, **kwargs)
        try:
            result = original(adder, req, *args, **kwargs)
        finally:
            if prefix_len:
                probe.armed = False
                locked, locked_swa = probe.drop, probe.swa_drop
            else:
                locked, locked_swa = 0, None
        try:
            # The capture's rows, written out here (a method call per candidate costs the pass):
            # admitted, with prefix and extend as the adder left them; else the prefix before.
            if len(run_list) > before and run_list[-1] is req:
                row = (req, req.prefix_len, req.extend_len)
                cap.admitted.append(row)
                cap.candidates.append((*row, result, locked, locked_swa))
            else:
                cap.candidates.append((req, prefix_len, 0, result, locked, locked_swa))
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
            cap.add_chunk(req, len(run_list) > before and run_list[-1] is req)
        except Exception as exc:
            hook_failed("add_chunked_req", exc)
        return result

    def chunk_budget_hook(original, budget, *args, **kwargs):
        result = original(budget, *args, **kwargs)
        cap = rec.capture
        if cap is not None and cap.in_chunk:
            cap.budget = result  # nested super() calls: the outermost result lands last
        return result

    def make_alloc_hook(op: str) -> Hook:
        if op == MAMBA_ALLOC:
            return mamba_alloc_hook
        requested_of = ALLOC_REQUESTED[op]

        def alloc_hook(original, allocator, *args, **kwargs):
            nonlocal in_alloc
            if in_alloc:
                return original(allocator, *args, **kwargs)
            try:
                requested = requested_of(args, kwargs)
                available = allocator.available_size()
            except Exception as exc:
                hook_failed(op, exc)
                return original(allocator, *args, **kwargs)
            in_alloc = True
            try:
                result = original(allocator, *args, **kwargs)
            finally:
                in_alloc = False
            try:
                on_alloc(op, requested, available, result is not None)
            except Exception as exc:
                hook_failed(op, exc)
            return result

        return alloc_hook

    open_slots, close_slots, slot_refused = rec.open_slots, rec.close_slots, rec.slot_refused
    rows_tally: SlotTally | None = None  # a request-row binding outside a pass: its slots' tally

    def mamba_alloc_hook(original, allocator, *args, **kwargs):
        # Each state slot is counted into a tally (capture.SlotTally), one record for many:
        # the pass's, opened at its first slot; outside a pass a row binding's, else the
        # call's own. ``MambaSlotAllocator.alloc`` calls no other allocator.
        if in_alloc:
            return original(allocator, *args, **kwargs)
        cap = rec.capture
        tally = rows_tally or (cap.slots if cap is not None else None)
        alone = False
        try:
            if tally is None:
                alone = cap is None
                tally = open_slots(allocator.free_slots)
            # ``alloc(need_size)``, read inline: a pass asks for a slot per request.
            tally.asked += args[0] if args else kwargs["need_size"]
        except Exception as exc:
            hook_failed(MAMBA_ALLOC, exc)
            return original(allocator, *args, **kwargs)
        result = original(allocator, *args, **kwargs)
        if result is None or alone:
            try:
                if result is None:
                    slot_refused(tally)
                if alone:
                    close_slots(tally)
            except Exception as exc:
                hook_failed(MAMBA_ALLOC, exc)
        return result

    def mamba_rows_hook(original, req_pool, *args, **kwargs):
        # A state slot per new request of the batch, one call each. In a pass they go into
        # the pass's tally; outside one, the binding is one record of its own.
        nonlocal rows_tally
        if in_alloc or rows_tally is not None or rec.capture is not None:
            return original(req_pool, *args, **kwargs)
        try:
            tally = rows_tally = open_slots(req_pool.mamba_allocator.free_slots)
        except Exception as exc:
            hook_failed(MAMBA_ALLOC, exc)
            return original(req_pool, *args, **kwargs)
        try:
            return original(req_pool, *args, **kwargs)  # "Not enough space for mamba cache" raises here
        finally:
            rows_tally = None
            if tally.asked:
                try:
                    close_slots(tally)
                except Exception as exc:
                    hook_failed(MAMBA_ALLOC, exc)

    def init_hook(original, scheduler, *args, **kwargs):
        result = original(scheduler, *args, **kwargs)
        try:
            rec.attach(scheduler)
            point_aiter_registry_at_hook()
            rec.close_at_exit()
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

    return [
        (PASS_TARGET, pass_hook),
        (f"{SCHED}.__init__", init_hook),
        (f"{SCHED}.run_event_loop", event_loop_hook),
        (f"{SCHED}._add_request_to_queue", add_to_queue_hook),
        (f"{SCHED}.send_abort_output", send_abort_output_hook),
        (f"{SCHED}.abort_request", abort_request_hook),
        (STREAM_OUTPUT, stream_output_hook),
        (CALC_PRIORITY_TARGET, calc_priority_hook),
        (INIT_NEW_TARGET, init_new_hook),
        (RELEASE_TARGET, release_hook),
        (ADD_ONE_REQ_TARGET, add_one_req_hook),
        (ADD_CHUNKED_REQ_TARGET, add_chunked_req_hook),
        *[(target, chunk_budget_hook) for target in BUDGET_TARGETS],
        *[(target, make_alloc_hook(alloc_op(cls, method))) for target, (cls, method) in zip(ALLOC_TARGETS, ALLOCATOR_METHODS)],
        (MAMBA_ROWS_TARGET, mamba_rows_hook),
        (AITER_TARGET, aiter_hook),
        *[(target, probe.hook) for target in LOCK_TARGETS],
    ]


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


def point_aiter_registry_at_hook() -> None:
    """The attention registry captured ``handle_attention_aiter`` at import: point it at the wrapper."""
    handler = sys.modules.get(AITER_MODULE)
    if handler is None:
        return
    wrapped = handler.handle_attention_aiter
    registry = handler.AttentionBackendRegistry._handlers
    for name, fn in list(registry.items()):
        if fn is not wrapped and fn is getattr(wrapped, "__wrapped__", None):
            registry[name] = wrapped
