"""The KV pools of one pass, each with its size, and which of them limits admission.

A plain model has one pool (``full``). A hybrid one adds an SWA pool
(tokens) or a mamba pool (state slots): ``KvSnapshot`` holds their free,
evictable and protected counts (None where the pool does not exist) and
``Header.pools`` their fixed sizes.

The *limiting pool* of a pass is the one with the least headroom for its
size: the smallest (free + evictable) / size. Ties go to the earlier pool in
``POOL_ORDER``. It is named only when the trace has more than one pool and
their sizes are known (``Header.pools``); a plain model has none. It reads
the counts at pass entry, not what the head request needs: a pool can limit
while the head still fits in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from schedtrace.tracer.contract.schema import KvSnapshot, PoolLayout

FULL: Final = "full"
SWA: Final = "swa"
MAMBA: Final = "mamba"
POOL_ORDER: Final = (FULL, SWA, MAMBA)
UNITS: Final = {FULL: "tokens", SWA: "tokens", MAMBA: "state slots"}


@dataclass(frozen=True)
class PoolCounts:
    """One pool at pass entry."""

    pool: str  # one of POOL_ORDER
    size: int | None  # from Header.pools; None: not recorded
    free: int
    evictable: int
    protected: int | None  # locked by the radix cache (hybrid pools only)

    @property
    def headroom(self) -> float | None:
        """(free + evictable) / size: 1.0 an empty pool, 0.0 a full one; None without a size."""
        if not self.size:
            return None
        return (self.free + self.evictable) / self.size


def pool_counts(kv: KvSnapshot, layout: PoolLayout | None) -> list[PoolCounts]:
    """The pools this pass recorded, in ``POOL_ORDER``."""
    pools = [PoolCounts(FULL, layout.full_size if layout else None, kv.available, kv.evictable, kv.protected)]
    if kv.swa_available is not None:
        pools.append(PoolCounts(SWA, layout.swa_size if layout else None, kv.swa_available,
                                kv.swa_evictable or 0, kv.swa_protected))
    if kv.mamba_available is not None:
        pools.append(PoolCounts(MAMBA, layout.mamba_size if layout else None, kv.mamba_available,
                                kv.mamba_evictable or 0, kv.mamba_protected))
    return pools


def limiting_pool(pools: list[PoolCounts]) -> str | None:
    """The pool with the smallest headroom, or None with one pool or unknown sizes."""
    sized = [p for p in pools if p.headroom is not None]
    if len(pools) < 2 or len(sized) < 2:
        return None
    return min(sized, key=lambda p: p.headroom).pool  # min keeps the first of equals: POOL_ORDER breaks ties
