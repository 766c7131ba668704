"""The four scheduler fixes, each one or more exact source edits of real sglang functions.

A ``Fix`` is the whole fix: per function, the snippet as it stands in sglang
0.5.23 and what replaces it. ``schedtrace.arms.patching`` checks the snippets against
the installed code and compiles the edits; ``schedtrace.arms.variants`` turns the fixes
on and off, all edits of a fix together. The rationale is in docs/fixes.md
and /work/shared/reference/sglang-scheduler-fixes-pr.txt.
"""

from __future__ import annotations

from schedtrace.arms.patching import Fix, SourceEdit, check_one_edit_per_function

CHUNK_CAP = Fix(
    "chunk-cap",
    (
        SourceEdit(
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
        ),
    ),
)

ONE_CHUNK = Fix(
    "one-chunk",
    (
        # The general path: the guard ran under shortest-prefill-first only.
        SourceEdit(
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
                if has_chunked_req or self.new_chunked_req is not None:
                    # Only one unfinished chunked request can be tracked, under any
                    # policy: the one in flight or the one this pass started.
                    return AddReqResult.OTHER
            """,
        ),
        # The ignore_eos path (radix cache off) chunks in add_one_req_ignore_eos,
        # which never sees has_chunked_req: guard it where it is dispatched, with
        # that path's own chunking condition (dllm requests it handles apart).
        SourceEdit(
            target="sglang.srt.managers.schedule_policy:PrefillAdder.add_one_req",
            old="""
                if req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True):
                    return self.add_one_req_ignore_eos(req)
            """,
            new="""
                if req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True):
                    if (
                        (has_chunked_req or self.new_chunked_req is not None)
                        and self.dllm_config is None
                        and self.rem_chunk_tokens is not None
                        and len(req.full_untruncated_fill_ids) - req.prefix_len
                        > self.rem_chunk_tokens
                    ):
                        # add_one_req_ignore_eos would start a second chunk (its cut
                        # falls back to any leftover), and only one unfinished
                        # chunked request can be tracked.
                        return AddReqResult.OTHER
                    return self.add_one_req_ignore_eos(req)
            """,
        ),
    ),
)

LATCH = Fix(
    "latch",
    (
        SourceEdit(
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
        ),
    ),
)

AITER = Fix(
    "aiter",
    (
        SourceEdit(
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
        ),
    ),
)

# Public order: the order fixes are listed, applied and reported in.
FIXES: dict[str, Fix] = {fix.name: fix for fix in (CHUNK_CAP, ONE_CHUNK, LATCH, AITER)}
FIX_NAMES: tuple[str, ...] = tuple(FIXES)

# Two edits of one function would need one combined code object; refuse early.
check_one_edit_per_function(FIXES.values())
