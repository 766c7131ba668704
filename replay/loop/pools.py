"""The pools a closed loop evolves: the full KV pool, a paged SWA pool, the mamba state slots.

Pure: no sglang, no I/O. ``LoopPools`` is the fixed part (from the trace
header: the SWA retain window or ring, the mamba slots a request takes),
``Pool`` one pool's free and evictable units at one step. How a step moves
them follows sglang 0.5.23 (``schedtrace.replay.loop.state`` applies it):

* full KV: admission takes the page-rounded extend, evicting when free runs out;
* paged SWA: every new KV page is paged on the SWA side too
  (``SWATokenToKVPoolAllocator.alloc_extend``); decode slides a request's
  window: once ``SGLANG_SWA_EVICTION_INTERVAL`` tokens have left it, they are
  freed (``ScheduleBatch.maybe_evict_swa``); without a radix cache a chunked
  prefill slides too. A per-request SWA ring is no pool here: its free
  count is the free request slots times the ring (``to_pass``);
* mamba: a new request takes ``mamba_slots_per_req`` state slots
  (``ensure_mamba_capacity``: its state plus tracking buffers), evicting
  cached states when free runs out; a continuing chunk keeps its own. Under
  the ``no_buffer`` strategy with a radix cache, each prefill or chunk that
  lands in the tree forks the request's state into a slot of its own for
  the new node (``MambaComponent.prepare_for_caching_req``, evicting if it
  must), which the request locks; the node its last fork made is unlocked,
  so its slot becomes evictable.

A finished request's KV becomes evictable (its last state, for mamba; its
tracking buffers are freed) with a radix cache, free without one; a
retracted request frees everything it held. The tree keeps a request's
forked state either way, unlocked (evictable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from schedtrace.tracer.contract.names import (
    MAMBA_NO_BUFFER,
    SGLANG_SWA_EVICTION_INTERVAL_DEFAULT,
    SGLANG_SWA_EVICTION_INTERVAL_ENV,
)
from schedtrace.tracer.contract.schema import Header

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopReq, LoopState



def swa_eviction_interval(header: Header) -> int:
    """The recorded server's SGLANG_SWA_EVICTION_INTERVAL (Header.settings), else sglang's default."""
    value = header.settings.get(SGLANG_SWA_EVICTION_INTERVAL_ENV)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else \
        SGLANG_SWA_EVICTION_INTERVAL_DEFAULT


@dataclass(frozen=True)
class LoopPools:
    """The hybrid pools' fixed sizes; the default is a full-pool model."""

    swa_window: int | None = None  # a paged SWA pool keeping this window per request
    swa_ring_cost: int = 0  # a per-request SWA ring of this many tokens
    swa_eviction_interval: int = SGLANG_SWA_EVICTION_INTERVAL_DEFAULT
    mamba_slots_per_req: int = 0  # 0: no mamba pool
    mamba_forks: bool = False  # each tree checkpoint forks the request's state (no_buffer, a radix cache)

    @classmethod
    def of(cls, header: Header) -> LoopPools:
        layout = header.pools
        if layout is None:
            return cls()
        swa = header.is_hybrid_swa
        return cls(
            swa_window=(layout.sliding_window or 0) if swa and not layout.swa_ring_cost else None,
            swa_ring_cost=layout.swa_ring_cost if swa else 0,
            mamba_slots_per_req=max(layout.mamba_slots_per_req, 1) if header.is_hybrid_mamba else 0,
            mamba_forks=header.is_hybrid_mamba and layout.mamba_strategy == MAMBA_NO_BUFFER
            and not header.server_args.disable_radix_cache,
            swa_eviction_interval=swa_eviction_interval(header),
        )

    @property
    def paged_swa(self) -> bool:
        return self.swa_window is not None


FULL_POOL: Final = LoopPools()


class Pool:
    """Free and evictable units of one pool; taking evicts when free runs out."""

    __slots__ = ("free", "evictable")

    def __init__(self, free: int, evictable: int) -> None:
        self.free = free
        self.evictable = evictable

    def fits(self, units: int) -> bool:
        return units <= self.free + self.evictable

    def shortfall(self, units: int) -> int:
        return max(0, units - self.free - self.evictable)

    def take(self, units: int) -> None:
        if units > self.free:
            evict = units - self.free
            self.evictable -= evict
            self.free += evict
        self.free -= units

    def pin(self, units: int) -> int:
        """Move up to ``units`` evictable units to a request (a cached prefix it locks)."""
        pinned = min(units, self.evictable)
        self.evictable -= pinned
        return pinned

    def give(self, units: int, cached: bool) -> None:
        """Units a request lets go of: into the cache (evictable) or free."""
        if cached:
            self.evictable += units
        else:
            self.free += units


def ceil_page(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


def floor_page(tokens: int, page_size: int) -> int:
    """``tokens`` in whole pages: what a radix tree holds of them."""
    return tokens // page_size * page_size


def swa_window_tokens(tokens: int, window: int, page_size: int) -> int:
    """SWA tokens a request keeps of ``tokens``: its window, page-rounded."""
    return min(tokens, -(-window // page_size) * page_size)


@dataclass
class StepPools:
    """The pools one step moves, and what it needs to know of them."""

    kv: Pool
    swa: Pool | None
    mamba: Pool | None
    pools: LoopPools
    page_size: int
    radix_cache: bool

    @classmethod
    def of(cls, state: LoopState, pools: LoopPools, page_size: int, radix_cache: bool) -> StepPools:
        swa = Pool(state.swa_free, state.swa_evictable or 0) if state.swa_free is not None else None
        mamba = Pool(state.mamba_free, state.mamba_evictable or 0) if state.mamba_free is not None else None
        return cls(Pool(state.free, state.evictable), swa, mamba, pools, page_size, radix_cache)

    def store(self, state: LoopState) -> None:
        state.free, state.evictable = self.kv.free, self.kv.evictable
        if self.swa is not None:
            state.swa_free, state.swa_evictable = self.swa.free, self.swa.evictable
        if self.mamba is not None:
            state.mamba_free, state.mamba_evictable = self.mamba.free, self.mamba.evictable


def hold(req: LoopReq, tokens: int, step: StepPools) -> None:
    """``req`` holds ``tokens``: the new pages come from the full pool, and the SWA pool's too."""
    grow = req.growth(tokens, step.page_size)  # what it shares with others is not its own
    if grow > 0:
        step.kv.take(grow)
        req.kv_held += grow
        if step.swa is not None:
            step.swa.take(grow)
            req.swa_held += grow
    req.kv_tokens = tokens


def slide_swa(req: LoopReq, tokens: int, step: StepPools, interval: int) -> None:
    """Free the SWA tokens that left ``req``'s window, once more than ``interval`` have."""
    window = step.pools.swa_window
    if step.swa is None or window is None:
        return
    keep = swa_window_tokens(tokens, window, step.page_size)
    if req.swa_held - keep > interval:
        step.swa.free += req.swa_held - keep
        req.swa_held = keep


def release(req: LoopReq, step: StepPools, cached: bool, kv_cached: int | None = None) -> None:
    """Everything ``req`` holds goes back: into the cache when it finished with a radix cache
    (``kv_cached``: only that many of its KV tokens, the rest freed; None: all of them)."""
    into_cache = (req.kv_held if kv_cached is None else min(kv_cached, req.kv_held)) if cached else 0
    step.kv.give(into_cache, True)
    step.kv.give(req.kv_held - into_cache, False)
    req.kv_held = 0
    if step.swa is not None:
        step.swa.give(req.swa_held, cached)
        req.swa_held = 0
    if step.mamba is not None and req.mamba_held:
        # The tree keeps a finished request's last state; its tracking buffers are freed.
        state_slot = 1 if cached else 0
        step.mamba.give(state_slot, True)
        step.mamba.give(req.mamba_held - state_slot, False)
        req.mamba_held = 0
    if step.mamba is not None and req.mamba_fork:
        step.mamba.give(1, True)  # its fork's node, unlocked
        req.mamba_fork = False


def fork_mamba(req: LoopReq, step: StepPools) -> None:
    """A checkpoint of ``req`` landed new tokens in the tree: its state is forked into a new
    slot for the node (``_alloc_mamba_slot``, evicting if it must), and its last fork unlocked."""
    if step.mamba is None or not step.pools.mamba_forks or not step.mamba.fits(1):
        return
    step.mamba.take(1)
    if req.mamba_fork:
        step.mamba.give(1, True)
    req.mamba_fork = True
