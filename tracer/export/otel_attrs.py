"""The ``schedtrace.*`` OpenTelemetry namespace: span, event and attribute names.

The one place these names are spelled; docs/otel.md documents each of them.
Both the live mirror (schedtrace.tracer.export.otel_mirror) and the OTLP export
(schedtrace.tracer.export.otlp) use them, so a dashboard built on one works on the other.
Values are lengths, counts and rids only, never prompt text or token ids.
It imports no OpenTelemetry: the Perfetto export names its passes with ``pass_result`` too.
"""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.analysis.outcome import pass_outcome
from schedtrace.tracer.contract.schema import Pass

INSTRUMENTATION_SCOPE: Final = "schedtrace"

# --- span -------------------------------------------------------------------

PASS_SPAN: Final = "schedtrace.pass"  # one per pass record
ORPHAN_SPAN: Final = "schedtrace.event"  # zero-length carrier of an event whose pass span already ended

# --- pass span attributes ---------------------------------------------------

PASS_SEQ: Final = "schedtrace.pass.seq"
PASS_REPEAT: Final = "schedtrace.pass.repeat"  # identical rejected passes folded into the record
PASS_IDLE_BEFORE: Final = "schedtrace.pass.idle_before"
PASS_RESULT: Final = "schedtrace.pass.result"  # one of PASS_RESULTS
QUEUE_WAITING: Final = "schedtrace.queue.waiting"  # requests waiting at pass entry
BATCH_RUNNING: Final = "schedtrace.batch.running"  # requests in the running batch at pass entry
KV_FREE: Final = "schedtrace.kv.free"  # free tokens in the full pool
KV_EVICTABLE: Final = "schedtrace.kv.evictable"  # tokens the radix cache could evict
# Hybrid models only (absent on a plain one): the other pools, and which pool limits.
KV_PROTECTED: Final = "schedtrace.kv.protected"  # full-pool tokens the radix cache holds locked
KV_SWA_FREE: Final = "schedtrace.kv.swa.free"  # free tokens in the SWA pool
KV_SWA_EVICTABLE: Final = "schedtrace.kv.swa.evictable"
KV_SWA_PROTECTED: Final = "schedtrace.kv.swa.protected"
KV_MAMBA_FREE: Final = "schedtrace.kv.mamba.free"  # free mamba state slots
KV_MAMBA_EVICTABLE: Final = "schedtrace.kv.mamba.evictable"
KV_MAMBA_PROTECTED: Final = "schedtrace.kv.mamba.protected"
KV_LIMITING_POOL: Final = "schedtrace.kv.limiting_pool"  # full | swa | mamba: least (free + evictable) / size
REQ_SLOTS_FREE: Final = "schedtrace.req_slots.free"
CANDIDATES: Final = "schedtrace.pass.candidates"  # add_one_req calls
ADMITTED: Final = "schedtrace.pass.admitted"  # requests admitted
ADMITTED_TOKENS: Final = "schedtrace.pass.admitted_tokens"  # sum of their extend lengths
CHUNK_SIZE: Final = "schedtrace.chunk.size"  # continuing chunk's extend (absent: not run)
CHUNK_BUDGET: Final = "schedtrace.chunk.budget"  # available_chunk_tokens (absent: deferred)
CHUNKED_PREFILL_SIZE: Final = "schedtrace.chunked_prefill_size"
BATCH_IS_FULL_IN: Final = "schedtrace.batch_is_full.in"
BATCH_IS_FULL_OUT: Final = "schedtrace.batch_is_full.out"
NEW_CHUNKED_RID: Final = "schedtrace.new_chunked.rid"
TP_RANK: Final = "schedtrace.tp_rank"
DP_RANK: Final = "schedtrace.dp_rank"

# schedtrace.pass.result values, first match wins
RESULT_ERROR: Final = "error"  # the pass raised
RESULT_ADMITTED: Final = "admitted"  # at least one request admitted
RESULT_CHUNK: Final = "chunk"  # only the continuing chunk ran
RESULT_REJECTED: Final = "rejected"  # work was waiting, nothing admitted
PASS_RESULTS: Final = (RESULT_ERROR, RESULT_ADMITTED, RESULT_CHUNK, RESULT_REJECTED)
# The attribute folds the finer outcome words (analysis.outcome) into those four values.
_RESULT_OF_OUTCOME: Final = {"error": RESULT_ERROR, "admit": RESULT_ADMITTED, "chunk": RESULT_CHUNK}


def pass_result(record: Pass) -> str:
    """The ``schedtrace.pass.result`` value of a pass."""
    return _RESULT_OF_OUTCOME.get(pass_outcome(record), RESULT_REJECTED)


# --- events on the pass span --------------------------------------------------

ALLOC_FAILED_EVENT: Final = "schedtrace.alloc_failed"
ALLOC_OP: Final = "schedtrace.alloc.op"
ALLOC_REQUESTED: Final = "schedtrace.alloc.requested"
ALLOC_FREE: Final = "schedtrace.alloc.free"
ALLOC_EVICTABLE: Final = "schedtrace.alloc.evictable"

# The pass raised: OpenTelemetry's own exception event and attributes.
EXCEPTION_EVENT: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"

HOOK_ERROR_EVENT: Final = "schedtrace.hook_error"
HOOK_NAME: Final = "schedtrace.hook.name"
HOOK_ERROR_COUNT: Final = "schedtrace.hook.count"

AITER_EVENT: Final = "schedtrace.aiter"
AITER_METHOD: Final = "schedtrace.aiter.method"
AITER_FORWARD_MODE: Final = "schedtrace.aiter.forward_mode"
AITER_SEQ_LENS_SUM: Final = "schedtrace.aiter.seq_lens_sum"
AITER_MAX_CHUNK_CAPACITY: Final = "schedtrace.aiter.max_chunk_capacity"
AITER_IN_PIECEWISE_GRAPH: Final = "schedtrace.aiter.in_piecewise_graph"
AITER_IN_BREAKABLE_GRAPH: Final = "schedtrace.aiter.in_breakable_graph"

LOSS_EVENT: Final = "schedtrace.loss"  # the recorder dropped records
LOSS_COUNT: Final = "schedtrace.loss.count"
LOSS_REASON: Final = "schedtrace.loss.reason"

# Only from `schedtrace export --format otlp --report`: the replay's findings.
DIVERGENCE_EVENT: Final = "schedtrace.divergence"
DIVERGENCE_KINDS: Final = "schedtrace.divergence.kinds"
DIVERGENCE_FIXES: Final = "schedtrace.divergence.fixes"
DIVERGENCE_OLD_ARM: Final = "schedtrace.divergence.old_arm"
DIVERGENCE_NEW_ARM: Final = "schedtrace.divergence.new_arm"
DIVERGENCE_OLD_ADMITTED: Final = "schedtrace.divergence.old.admitted"
DIVERGENCE_NEW_ADMITTED: Final = "schedtrace.divergence.new.admitted"
STALL_EVENT: Final = "schedtrace.stall"  # on the onset pass of a stall
STALL_ARM: Final = "schedtrace.stall.arm"
STALL_PASSES: Final = "schedtrace.stall.passes"
STALL_END_PASS: Final = "schedtrace.stall.end_pass"
STALL_HEAD_RID: Final = "schedtrace.stall.head_rid"
