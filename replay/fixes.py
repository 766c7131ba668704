"""The four scheduler fixes, each one exact source edit of a real sglang function.

Each ``SourceEdit`` is the whole fix: the snippet as it stands in sglang
0.5.23 and what replaces it. ``replay.patching`` checks the snippet against the
installed code and compiles the edit; ``replay.variants`` turns the fixes on
and off. The rationale is in docs/fixes.md and
/work/shared/reference/sglang-scheduler-fixes-pr.txt.
"""

from __future__ import annotations

from replay.patching import SourceEdit

CHUNK_CAP = SourceEdit(
    fix="chunk-cap",
    target="sglang.srt.mem_cache.prefill_budget:PrefillBudget.available_chunk_tokens",
    old="""
        available = min(chunk_limit, int(self.remaining_total))
        # Single-pool continuation must make progress to release its KV.
        return available if available > 0 else chunk_limit
    """,
    new="""
        # Cap by free + evictable KV, less the page alloc_extend can over-ask.
        available = min(chunk_limit, int(self.remaining_total) - self.page_size)
        if available > 0:
            return available
        # Decode reservations took the budget, but the continuation must still
        # progress to release its KV: run with the KV allocatable now, or defer.
        allocatable = min(chunk_limit, int(self.remaining_current) - self.page_size)
        return allocatable if allocatable > 0 else None
    """,
)

ONE_CHUNK = SourceEdit(
    fix="one-chunk",
    target="sglang.srt.managers.schedule_policy:PrefillAdder._select_prefill_admission",
    old="""
        if (
            has_chunked_req
            and get_schedule().schedule_policy == "shortest-prefill-first"
        ):
            # Only one unfinished chunked request can be tracked.
            return AddReqResult.OTHER
    """,
    new="""
        if has_chunked_req:
            # Only one unfinished chunked request can be tracked, under any policy.
            return AddReqResult.OTHER
    """,
)

LATCH = SourceEdit(
    fix="latch",
    target="sglang.srt.managers.scheduler:Scheduler._get_new_batch_prefill_raw",
    old="""
        if self.enable_priority_preemption or self.is_hybrid_swa:
            # Reset batch_is_full to try preemption with a prefill adder.
            running_batch.batch_is_full = False
        if running_batch.is_empty():
            # An empty batch has no request left to leave, and only a leaving
            # request clears the flag elsewhere, so admission would stay shut.
            running_batch.batch_is_full = False
    """,
    new="""
        # Re-evaluate batch_is_full on every pass: a latched flag would stall the
        # waiting queue while KV is free. PrefillAdder still enforces the limits.
        running_batch.batch_is_full = False
    """,
)

AITER = SourceEdit(
    fix="aiter",
    target="sglang.srt.models.deepseek_common.attention_backend_handler:handle_attention_aiter",
    old="""
        if is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph():
            return AttnForwardMethod.MHA
        if forward_batch.forward_mode.is_extend_without_speculative():
            if not _support_mha_one_shot(attn, forward_batch, "aiter"):
                return AttnForwardMethod.MHA_CHUNKED_KV
    """,
    new="""
        if forward_batch.forward_mode.is_extend_without_speculative():
            if not _support_mha_one_shot(attn, forward_batch, "aiter"):
                # Over capacity stays on chunked KV, in graph context too.
                return AttnForwardMethod.MHA_CHUNKED_KV
        if is_in_tc_piecewise_cuda_graph() or is_in_breakable_cuda_graph():
            return AttnForwardMethod.MHA
        if forward_batch.forward_mode.is_extend_without_speculative():
    """,
)

# Public order: the order fixes are listed, applied and reported in.
FIXES: dict[str, SourceEdit] = {edit.fix: edit for edit in (CHUNK_CAP, ONE_CHUNK, LATCH, AITER)}
FIX_NAMES: tuple[str, ...] = tuple(FIXES)

# Two fixes on one function would need one combined code object; refuse early.
assert len({edit.target for edit in FIXES.values()}) == len(FIXES)
