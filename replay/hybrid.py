"""Which pools a trace's scheduler had, whether replay can rebuild them, and
how each of the four fixes meets them.

Pure apart from reading sglang's budget classes (which ``available_chunk_tokens``
a budget runs): no state, no I/O. ``pool_family`` is what ``PassDriver`` and
the closed loop build their stand-ins from; ``fix_notes`` is the replay
report's per-fix note on a hybrid trace.

Families replay rebuilds (sglang 0.5.23, separate pools):

* ``full``: one KV pool (any allocator with the base ``PrefillBudget``);
* ``swa``: ``SWATokenToKVPoolAllocator`` (full and SWA sides, paged or a
  per-request SWA ring) under ``SWAPrefillBudget`` (gpt-oss, Gemma, MiMo);
* ``mamba``: a full-pool allocator beside a ``HybridReqToTokenPool`` whose
  ``MambaSlotAllocator`` holds one state per request (Qwen3-Next, NemotronH,
  Kimi-K3's KDA layers).

Shared-byte pools (the ``Unified*`` allocators of ``--enable-unified-memory``,
``SharedSWAPrefillBudget``) and pure-SWA models are refused: their budgets
price full, SWA and mamba bytes against one envelope a trace does not hold.
"""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.analysis.admission_hybrid import FULL_ALLOCATORS
from schedtrace.tracer.contract.schema import Header, PoolLayout

FULL, SWA, MAMBA = "full", "swa", "mamba"

# Allocator classes a hybrid trace may name, by the family replay rebuilds.
SWA_ALLOCATORS: Final = frozenset({"SWATokenToKVPoolAllocator"})


def pool_family(header: Header) -> str:
    """``full``, ``swa`` or ``mamba``; ``ReplayStateError`` for pools replay cannot rebuild."""
    if not header.is_hybrid_swa and not header.is_hybrid_mamba:
        return FULL
    layout = header.pools
    if layout is None:
        raise ReplayStateError(
            "hybrid SWA/mamba trace without the pool layout (Header.pools): it predates "
            "hybrid recording, so only the full pool's state is known"
        )
    if header.is_hybrid_swa and header.is_hybrid_mamba:
        raise ReplayStateError(
            f"SWA and mamba pools together ({layout.allocator}) are not replayable: "
            "their budgets share one byte envelope"
        )
    allowed = SWA_ALLOCATORS if header.is_hybrid_swa else FULL_ALLOCATORS
    if layout.allocator not in allowed:
        raise ReplayStateError(
            f"allocator {layout.allocator} is not replayable: hybrid replay rebuilds "
            f"{', '.join(sorted(allowed))} (separate pools, not --enable-unified-memory)"
        )
    if header.is_hybrid_mamba and layout.mamba_slot_cost:
        raise ReplayStateError(
            f"mamba states priced in the full pool (slot cost {layout.mamba_slot_cost} tokens) are not replayable"
        )
    return SWA if header.is_hybrid_swa else MAMBA


def fix_notes(header: Header) -> dict[str, str]:
    """How each fix meets this trace's pools (empty for a full-pool trace)."""
    family = pool_family(header)
    if family == FULL:
        return {}
    layout = header.pools
    assert layout is not None  # pool_family checked it
    aiter = "applies: the aiter attention dispatch (MLA extends) does not depend on the pools"
    if family == SWA:
        return {
            "chunk-cap": _swa_chunk_cap(layout),
            "one-chunk": "applies: the guard is in PrefillAdder, whose admission paths SWA pools share",
            "latch": (
                "already present: under is_hybrid_swa stock sglang resets batch_is_full on every "
                "pass (the branch the fix replaces), so the fix changes no decision here"
            ),
            "aiter": aiter,
        }
    grid = header.mamba_chunk_grid
    one_chunk = "applies: the guard is in PrefillAdder, whose admission paths mamba pools share"
    if grid > 1:
        one_chunk += (
            f"; the {grid}-token mamba chunk grid floors a continuing chunk's cut and leaves up to "
            f"{grid - 1} tokens of chunk budget, which the ignore_eos path would start a second chunk from"
        )
    return {
        "chunk-cap": (
            f"applies: {layout.allocator} budgets with the base PrefillBudget, over the full pool "
            "(free + full_evictable_size); the mamba state slots are not in that budget"
        ),
        "one-chunk": one_chunk,
        "latch": "applies: is_hybrid_swa is off, so a latched batch_is_full stays until the batch shrinks",
        "aiter": aiter,
    }


def _swa_chunk_cap(layout: PoolLayout) -> str:
    """Whether the SWA allocator's budget runs the method chunk-cap edits (read off sglang)."""
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget, SWAPrefillBudget

    if "available_chunk_tokens" not in SWAPrefillBudget.__dict__:
        return f"applies: {layout.allocator}'s SWAPrefillBudget inherits the edited PrefillBudget method"
    if not _defers_when_spent(SWAPrefillBudget):
        return "applies: SWAPrefillBudget sizes the continuing chunk itself but does not defer it"
    ring = " (a per-request SWA ring: the full side only)" if layout.swa_ring_cost else ""
    return (
        f"not reached: {layout.allocator} budgets with SWAPrefillBudget, whose own "
        f"available_chunk_tokens caps a continuing chunk by the full and SWA budgets{ring} and "
        f"already returns None (defer) when they are spent; the fix edits only {PrefillBudget.__name__}'s"
    )


def _defers_when_spent(budget_class: type) -> bool:
    """Run the real method on a spent budget: does it return None?"""
    budget = budget_class.__new__(budget_class)
    budget.page_size = 1
    budget.req_ring = False
    budget.total_offset = budget.current_offset = budget.swa_offset = 0
    budget._available_and_evictable = lambda: 0  # noqa: SLF001 - the spent budget
    budget.allocator = _Spent()
    budget.tree_cache = _Spent()
    return budget.available_chunk_tokens(64) is None


class _Spent:
    """Pool and cache with nothing left (for ``_defers_when_spent``)."""

    def swa_available_size(self) -> int:
        return 0

    def swa_evictable_size(self) -> int:
        return 0
