"""Free, evictable and protected counts of every pool the scheduler reads.

Full, SWA and mamba pools alike: read on the scheduler thread at pass entry
(``PoolReaders.counts``, ints only, a handful of bound method calls) and
turned into a ``KvSnapshot`` on the writer thread (``kv_row``). ``pool_layout`` is the
header's fixed part: the pool classes and the sizes the hybrid budgets read.

The counts are the ones sglang 0.5.23's admission reads: ``PrefillBudget``
the full pool's (``full_evictable_size`` under a mamba tree),
``SWAPrefillBudget`` both sides of an SWA allocator, ``ensure_mamba_capacity``
the free mamba state slots. A plain (full-pool) model pays for two calls, as
before; the protected counts are read only where there is a hybrid pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedtrace.tracer.contract.schema import KvSnapshot, PoolLayout


class PoolReaders:
    """The bound count readers of one scheduler's pools, resolved once (at the recorder's
    first read, ``Recorder.pool_readers``): a scheduler keeps its pools for its lifetime,
    and resolving a reader costs a getattr per count, which a pass should not pay."""

    __slots__ = ("counts", "evictable", "swa_evictable", "mamba_evictable")

    def __init__(self, scheduler: Any) -> None:
        allocator = scheduler.token_to_kv_pool_allocator
        tree_cache = scheduler.tree_cache
        mamba_allocator = getattr(scheduler.req_to_token_pool, "mamba_allocator", None)
        swa = getattr(scheduler, "is_hybrid_swa", False)
        # The evictable count the budget reads (KvSnapshot.evictable, Alloc.evictable): the full
        # pool's under a hybrid tree (PrefillBudget under mamba, SWAPrefillBudget), else the tree's.
        hybrid_tree = swa or tree_cache.supports_mamba()
        self.evictable: Callable[[], int] = _reader(
            tree_cache, "full_evictable_size" if hybrid_tree else "evictable_size", tree_cache.evictable_size)
        self.swa_evictable: Callable[[], int] | None = None  # KvSnapshot.swa_evictable's reader
        self.mamba_evictable: Callable[[], int] | None = None  # KvSnapshot.mamba_evictable's reader
        if not swa and mamba_allocator is None:
            available, evictable = allocator.available_size, self.evictable
            self.counts: Callable[[], tuple] = lambda: (available(), evictable())  # a plain model: two calls
        else:
            readers = _hybrid_readers(allocator, tree_cache, mamba_allocator, swa, self.evictable)
            fields = KvSnapshot.__struct_fields__
            self.swa_evictable = readers[fields.index("swa_evictable")]
            self.mamba_evictable = readers[fields.index("mamba_evictable")]
            self.counts = _hybrid_counts(readers)


def _hybrid_readers(allocator: Any, tree_cache: Any, mamba_allocator: Any, swa: bool, evictable: Any) -> tuple:
    """The readers of ``KvSnapshot``'s fields, in order; None where a field stays None.
    ``evictable``: the full pool's evictable reader (``PoolReaders.evictable``)."""
    if swa:
        swa_readers = (
            _reader(allocator, "full_available_size", allocator.available_size),
            _reader(allocator, "swa_available_size", None),
            _reader(tree_cache, "swa_evictable_size", None),
            _reader(tree_cache, "swa_protected_size", None),
        )
    else:
        swa_readers = (allocator.available_size, None, None, None)
    available, swa_available, swa_evictable, swa_protected = swa_readers
    if mamba_allocator is None:
        mamba_available = mamba_evictable = mamba_protected = None
    else:
        mamba_available = mamba_allocator.available_size
        mamba_evictable = _reader(tree_cache, "mamba_evictable_size", None)
        mamba_protected = _reader(tree_cache, "mamba_protected_size", None)
    return (
        available, evictable, swa_available,
        swa_evictable, mamba_available, mamba_evictable,
        _reader(tree_cache, "full_protected_size", tree_cache.protected_size), swa_protected, mamba_protected,
    )


def _hybrid_counts(readers: tuple) -> Callable[[], tuple]:
    """One call that reads every count: the two families' shapes written out (a
    comprehension over the readers costs about 1 us more per pass), else the general form."""
    a, fe, sa, se, ma, me, fp, sp, mp = readers
    swa_side, mamba_side = (sa, se, sp), (ma, me, mp)
    if all(swa_side) and not any(mamba_side):
        return lambda: (a(), fe(), sa(), se(), None, None, fp(), sp(), None)
    if all(mamba_side) and not any(swa_side):
        return lambda: (a(), fe(), None, None, ma(), me(), fp(), None, mp())
    return lambda: tuple([None if read is None else read() for read in readers])


def kv_row(counts: tuple) -> KvSnapshot:
    return KvSnapshot(*counts)


def pool_layout(scheduler: Any) -> PoolLayout:
    """The pool classes and the fixed sizes the hybrid budgets read (``Header.pools``)."""
    allocator = scheduler.token_to_kv_pool_allocator
    tree_cache = scheduler.tree_cache
    req_pool = scheduler.req_to_token_pool
    mamba_allocator = getattr(req_pool, "mamba_allocator", None)
    swa = getattr(scheduler, "is_hybrid_swa", False)
    mamba_layout: dict[str, Any] = {}
    if mamba_allocator is not None:
        strategy = getattr(scheduler.server_args, "mamba_radix_cache_strategy", None)
        mamba_layout = dict(
            mamba_size=int(mamba_allocator.size),
            # ensure_mamba_capacity: one state slot, plus the tracking buffers a new request takes.
            mamba_slots_per_req=1 + int(getattr(req_pool, "mamba_initial_tracking_slots", 0) or 0),
            mamba_slot_cost=int(_call(allocator, "mamba_slot_full_token_cost", 0)),
            mamba_strategy=None if strategy is None else str(strategy),
            mamba_extra_buffer=bool(getattr(tree_cache, "enable_mamba_extra_buffer", False)),
        )
    window = getattr(tree_cache, "sliding_window_size", None) if swa else None
    return PoolLayout(
        allocator=type(allocator).__name__,
        tree_cache=type(tree_cache).__name__,
        full_size=int(getattr(allocator, "size_full", allocator.size)),
        swa_size=int(allocator.size_swa) if swa else None,
        swa_ring_cost=int(getattr(allocator, "swa_ring_cost_tokens", 0) or 0) if swa else 0,
        sliding_window=None if window is None else int(window),
        **mamba_layout,
    )


def exact_chunk_fill() -> bool:
    """sglang's ``_use_exact_chunk_fill()`` here: the gate ``PrefillAdder`` ands with
    "no mamba tree sharing prefixes" (env and gfx95 hardware, so replay cannot see it)."""
    try:
        from sglang.srt.managers.schedule_policy import _use_exact_chunk_fill

        return bool(_use_exact_chunk_fill())
    except Exception:  # an sglang without exact chunk fill: billed by pages
        return False


def _call(obj: Any, name: str, fallback: Any) -> Any:
    method = getattr(obj, name, None)
    if method is not None:
        return method()
    return fallback() if callable(fallback) else fallback


def _reader(obj: Any, name: str, fallback: Any) -> Any:
    """``obj.name`` bound, else ``fallback`` (a reader, or None: the count is not there).

    On sglang's unified tree, whose count methods only hand the call to its ``tree_core``
    (made once, with the tree; ``reset`` resets it in place), the core's own method: one
    frame less per read, and the recorder reads up to five per pass. Not where a subclass
    defines the count itself."""
    method = getattr(obj, name, None)
    if method is None:
        return fallback
    core = getattr(obj, "tree_core", None)
    if core is not None and getattr(type(obj), name, None) is getattr(_unified_tree(), name, False):
        return getattr(core, name, method)
    return method


def _unified_tree() -> type | None:
    try:
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    except ImportError:  # an sglang without the unified tree
        return None
    return UnifiedRadixCache
