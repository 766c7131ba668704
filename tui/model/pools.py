"""The KV pools a pass saw: the full pool, and the SWA and mamba pools of hybrid models."""

from __future__ import annotations

from schedtrace.tracer.contract.schema import KvSnapshot


def pool_rows(kv: KvSnapshot) -> list[tuple[str, str]]:
    """(label, value) per pool: free and evictable, each only where it was recorded.

    A plain model records only the full pool; a hybrid one also fills the SWA
    and mamba counts (None elsewhere), and then those pools get rows too.
    """
    pools = (("kv", kv.available, kv.evictable), ("swa", kv.swa_available, kv.swa_evictable),
             ("mamba", kv.mamba_available, kv.mamba_evictable))
    rows = []
    for pool, free, evictable in pools:
        known = [(word, value) for word, value in (("free", free), ("evictable", evictable)) if value is not None]
        if known:
            rows.append((f"{pool} " + " / ".join(word for word, _ in known),
                         " / ".join(str(value) for _, value in known)))
    return rows
