"""The hybrid pools' part of sglang's admission check, for ``admission.head_check``.

sglang 0.5.23 builds the prefill budget from the allocator
(``create_prefill_budget``). Of the hybrid families replay rebuilds
(``replay/hybrid.py``):

* SWA (``SWATokenToKVPoolAllocator``) budgets with ``SWAPrefillBudget``: the
  full side as the base budget (``full_available_size`` +
  ``full_evictable_size``), and beside it ``remaining_swa`` = free SWA tokens
  + SWA evictable (0 under a per-request ring) − ``swa_offset``. A head must
  also fit the SWA side (``estimate_swa_kv_tokens``: the uncached tail past
  the window, plus at most a window, plus a page; a ring costs its fixed
  ring), strictly for a paged pool and not strictly for a ring; a head that
  could never fit may be cut to ``_chunk_cap``. ``SwaBudget`` mirrors that.
* mamba (a full-pool allocator beside ``MambaSlotAllocator``) budgets with the
  base ``PrefillBudget`` over the full pool: the free state slots are not read
  by admission at all (``rem_mamba_slots`` is None unless the allocator prices
  slots in full tokens; ``ensure_mamba_capacity`` reclaims slots after the
  batch is chosen). So the full-pool mirror is already exact there.

``hybrid_notes`` names what the mirror does not repeat: shared-byte pools
(``Unified*`` allocators, ``SharedSWAPrefillBudget``), SWA and mamba together,
a trace without the pool layout. Pure: no sglang import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from schedtrace.tracer.contract.schema import Header, Pass

SWA_ALLOCATOR: Final = "SWATokenToKVPoolAllocator"
FULL_ALLOCATORS: Final = frozenset({"TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"})
SWA_LOCK_NOTE: Final = "SWA share of a prefix lock not recorded (its last window assumed)"
SWA_BOUND: Final = "remaining_swa"


@dataclass(frozen=True)
class SwaLimits:
    """The fixed sizes ``SWAPrefillBudget`` reads (``Header.pools``)."""

    size: int  # allocator.size_swa
    ring_cost: int  # > 0: a per-request SWA ring of this many tokens
    window: int | None  # tree_cache.sliding_window_size
    page: int

    @property
    def ring(self) -> bool:
        return self.ring_cost > 0


def hybrid_notes(header: Header) -> tuple[str, ...]:
    """What the mirror cannot repeat for this trace's pools (empty: exact)."""
    if not header.is_hybrid_swa and not header.is_hybrid_mamba:
        return ()
    layout = header.pools
    if layout is None:
        return ("hybrid pools without their layout (Header.pools)",)
    if header.is_hybrid_swa and header.is_hybrid_mamba:
        return ("SWA and mamba pools in one byte envelope not mirrored",)
    if header.is_hybrid_swa and layout.allocator != SWA_ALLOCATOR:
        return (f"{layout.allocator} budget not mirrored",)
    if header.is_hybrid_mamba and (layout.allocator not in FULL_ALLOCATORS or layout.mamba_slot_cost):
        return (f"mamba states priced in the full pool ({layout.allocator}) not mirrored",)
    return ()


def swa_limits(header: Header) -> SwaLimits | None:
    """The SWA budget's sizes, or None where there is no separate SWA pool to mirror."""
    layout = header.pools
    if not header.is_hybrid_swa or layout is None or hybrid_notes(header):
        return None
    return SwaLimits(layout.swa_size or 0, layout.swa_ring_cost, layout.sliding_window,
                     max(1, header.server_args.page_size))


@dataclass
class SwaBudget:
    """``SWAPrefillBudget``'s SWA side over one pass (mutated by ``admission`` only)."""

    limits: SwaLimits
    available: int  # swa_available_size(): free SWA tokens, or free rows × the ring
    evictable: int  # swa_evictable_size(), less what admitted prefixes pinned
    offset: int = 0  # swa_offset
    recorded: dict[str, int] = field(default_factory=dict)  # Candidate.locked_swa_evictable by rid
    at_entry: int = field(init=False)  # the SWA evictable count before any lock of this pass

    def __post_init__(self) -> None:
        self.at_entry = self.evictable

    def remaining(self, held: int = 0) -> int:
        """``remaining_swa`` while a further ``held`` SWA tokens are pinned."""
        evictable = 0 if self.limits.ring else self.evictable - held
        return self.available + evictable - self.offset

    def tokens(self, extend: int, max_new: int, chunk_limit: int | None = None) -> int:
        """``swa_tokens``: the peak SWA reservation (``estimate_swa_kv_tokens``)."""
        lim = self.limits
        if lim.ring:
            return lim.ring_cost
        if lim.window is None or lim.window <= 0:
            return extend + max_new + lim.page
        allocated = extend if chunk_limit is None else min(extend, chunk_limit)
        return max(allocated - lim.window, 0) + min(extend + max_new, lim.window) + lim.page

    def check(self, paged_extend: int, max_new: int, chunk_limit: int | None, held: int) -> tuple[bool, int | None, int]:
        """``check_prefill``'s SWA half: (fits, chunk limit, tokens needed)."""
        lim = self.limits
        needed = self.tokens(paged_extend, max_new, chunk_limit)
        remaining = self.remaining(held)
        if (needed <= remaining) if lim.ring else (needed < remaining):
            return True, chunk_limit, needed
        cap = 0  # only a request that can never fit is cut to what the window leaves
        if (needed > lim.size) if lim.ring else (needed >= lim.size):
            cap = max(0, (remaining - self.tokens(0, max_new)) // lim.page * lim.page)
        if chunk_limit is None or cap <= 0:
            return False, None, needed
        return True, min(chunk_limit, cap), needed

    def chunk_budget(self, chunk_limit: int, remaining_total: float) -> int | None:
        """``SWAPrefillBudget.available_chunk_tokens`` (its own: chunk-cap edits only the base's)."""
        available = min(chunk_limit, int(remaining_total))
        if not self.limits.ring:
            available = min(available, self.remaining() - self.limits.page)
        return available if available > 0 else None

    def reserve(self, paged_extend: int, max_new: int, chunk_limit: int | None, continuation: bool) -> None:
        if not (self.limits.ring and continuation):  # a continuation already owns its ring
            self.offset += self.tokens(paged_extend, max_new, chunk_limit)

    def lock_share(self, rid: str, prefix: int) -> int:
        """SWA evictable tokens locking a prefix pins (as replay's tree cache takes them):
        the recorded drop, else the prefix's last window."""
        if prefix == 0:
            return 0  # the root: nothing pinned
        recorded = self.recorded.get(rid)
        share = min(prefix, self.limits.window or prefix) if recorded is None else min(recorded, prefix)
        return min(share, self.evictable)

    def lock_notes(self, locks: list[tuple[str, int]]) -> tuple[str, ...]:
        """SWA_LOCK_NOTE when a ``(rid, prefix)`` lock of this check pins evictable SWA
        tokens the trace did not measure: the server's tree may pin another share."""
        if self.limits.ring or self.at_entry <= 0:
            return ()
        assumed = any(prefix > 0 and rid not in self.recorded for rid, prefix in locks)
        return (SWA_LOCK_NOTE,) if assumed else ()


def pass_notes(p: Pass, limits: SwaLimits | None) -> tuple[str, ...]:
    """What this pass's record leaves the SWA mirror to assume."""
    if limits is not None and not limits.ring and p.kv.swa_available is None:
        return ("a pass without the SWA free count",)
    return ()


def swa_budget(p: Pass, limits: SwaLimits | None) -> SwaBudget | None:
    """The pass's SWA side at entry; None without a mirrored SWA pool."""
    if limits is None:
        return None
    kv = p.kv
    available = p.req_slots_free * limits.ring_cost if limits.ring else kv.swa_available or 0
    recorded = {c.rid: c.locked_swa_evictable for c in p.candidates if c.locked_swa_evictable is not None}
    return SwaBudget(limits, available, kv.swa_evictable or 0, recorded=recorded)
