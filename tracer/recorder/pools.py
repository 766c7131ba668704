"""Free and evictable counts of every pool the scheduler reads.

Full, SWA and mamba pools alike: read on the scheduler thread at pass entry
(``kv_counts``, ints only) and turned into a ``KvSnapshot`` on the writer
thread (``kv_row``).
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.schema import KvSnapshot


def kv_counts(scheduler: Any) -> tuple:
    """Free and evictable tokens of every pool, as ``KvSnapshot``'s field tuple."""
    allocator = scheduler.token_to_kv_pool_allocator
    tree_cache = scheduler.tree_cache
    if getattr(scheduler, "is_hybrid_swa", False):
        available = _call(allocator, "full_available_size", allocator.available_size)
        swa_available = _call(allocator, "swa_available_size", None)
        evictable = _call(tree_cache, "full_evictable_size", tree_cache.evictable_size)
        swa_evictable = _call(tree_cache, "swa_evictable_size", None)
    else:
        available = allocator.available_size()
        evictable = tree_cache.full_evictable_size() if tree_cache.supports_mamba() else tree_cache.evictable_size()
        swa_available = swa_evictable = None
    mamba_allocator = getattr(scheduler.req_to_token_pool, "mamba_allocator", None)
    if mamba_allocator is None:
        return (available, evictable, swa_available, swa_evictable)
    return (
        available, evictable, swa_available, swa_evictable,
        mamba_allocator.available_size(), _call(tree_cache, "mamba_evictable_size", None),
    )


def kv_row(counts: tuple) -> KvSnapshot:
    return KvSnapshot(*counts)


def evictable_tokens(scheduler: Any) -> int:
    """What the radix cache could evict from the full pool right now."""
    return cache_evictable(scheduler.tree_cache)


def cache_evictable(tree_cache: Any) -> int:
    """The evictable count ``PrefillBudget`` reads (full pool under mamba)."""
    if tree_cache.supports_mamba():
        return tree_cache.full_evictable_size()
    return tree_cache.evictable_size()


def _call(obj: Any, name: str, fallback: Any) -> Any:
    method = getattr(obj, name, None)
    if method is not None:
        return method()
    return fallback() if callable(fallback) else fallback
