"""The recorder's hook table: each target (``targets``) and the factory of its hook.

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

from collections.abc import Callable

from schedtrace.tracer.recorder import hooks_lifecycle as life
from schedtrace.tracer.recorder import hooks_pass as in_pass
from schedtrace.tracer.recorder.hooks_alloc import alloc_hooks
from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS
from schedtrace.tracer.recorder.targets import (ADD_CHUNKED_REQ_TARGET, ADD_ONE_REQ_TARGET, AITER_TARGET,
                                                BUDGET_TARGETS, CALC_PRIORITY_TARGET, INIT_NEW_TARGET,
                                                PASS_TARGET, RELEASE_TARGET, SCHED, STREAM_OUTPUT, Hook)

# target -> the factory of its hook
HOOK_TABLE: tuple[tuple[str, Callable[[Recorder], Hook]], ...] = (
    (PASS_TARGET, in_pass.pass_hook),
    (CALC_PRIORITY_TARGET, in_pass.calc_priority_hook),
    (INIT_NEW_TARGET, in_pass.init_new_hook),
    (RELEASE_TARGET, in_pass.release_hook),
    (ADD_ONE_REQ_TARGET, in_pass.add_one_req_hook),
    (ADD_CHUNKED_REQ_TARGET, in_pass.add_chunked_req_hook),
    *[(target, in_pass.chunk_budget_hook) for target in BUDGET_TARGETS],
    (f"{SCHED}.__init__", life.init_hook),
    (f"{SCHED}.run_event_loop", life.event_loop_hook),
    (f"{SCHED}._add_request_to_queue", life.add_to_queue_hook),
    (f"{SCHED}.send_abort_output", life.send_abort_output_hook),
    (f"{SCHED}.abort_request", life.abort_request_hook),
    (STREAM_OUTPUT, life.stream_output_hook),
    (AITER_TARGET, life.aiter_hook),
)


def make_hooks(rec: Recorder) -> list[tuple[str, Hook]]:
    """(dotted target, AROUND hook) pairs for every hook point of ``rec``."""
    return [
        *[(target, factory(rec)) for target, factory in HOOK_TABLE],
        *alloc_hooks(rec),  # their own table: the allocator hooks share one nesting flag (AllocNesting)
        *[(target, rec.lock_probe.hook) for target in LOCK_TARGETS],
    ]
