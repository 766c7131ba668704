"""The recorder's hook points: the dotted names of the sglang functions it wraps.

Named here once: the hook table (``hooks.make_hooks``), the bench and the
tests that drive one pass through them all read these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS

Hook = Callable[..., Any]  # an AROUND hook: (original, *args, **kwargs) -> what original returns

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
