"""Rebuild real sglang scheduling state from one recorded pass.

Real sglang objects everywhere the decision is made: ``Req`` (dummy token ids
of the recorded lengths, ``schedtrace.replay.requests``), ``ScheduleBatch`` for the running batch,
``SchedulePolicy``, ``PrefillAdder`` and ``PrefillBudget`` (built by the real
allocator base class). Stand-ins exist only for the three stores whose
contents a trace does not hold and whose answers it does record:

* ``RecordedAllocator``: the KV allocator; ``available_size()`` is the
  recorded free count. It never allocates.
* ``RecordedTreeCache``: the prefix cache; it answers each request's recorded
  prefix match, reports the recorded evictable count and takes locks the way
  the radix cache does (a lock pins the matched prefix out of the evictable
  count, an unlock gives it back). How much of a prefix was still evictable
  is the candidate's recorded ``locked_evictable`` (part of it may already be
  pinned by a running request); traces without it assume all of it was.
* ``RecordedReqSlots``: the req_to_token pool; ``available_size()`` is the
  recorded free row count.

Hybrid pools (``schedtrace.replay.hybrid``) get siblings of the same kind, so
that sglang's own hybrid code runs on them: ``RecordedSWAAllocator`` is a real
``SWATokenToKVPoolAllocator`` whose full and SWA sides are two
``RecordedAllocator``s (its ``available_size``, ``swa_available_size``, ring
accounting and ``create_prefill_budget`` -> ``SWAPrefillBudget`` are sglang's);
``RecordedHybridReqSlots`` carries a ``RecordedMambaSlots`` (a real
``MambaSlotAllocator`` reporting the recorded free state slots); the tree cache
reports the SWA and mamba evictable counts and, for SWA, pins a candidate's
prefix on both sides.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

from schedtrace.replay.sglang_env import ensure_sglang_importable

ensure_sglang_importable()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    BasePrefixCache,
    DecLockRefResult,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    MatchPrefixParams,
    MatchResult,
    _dfs_weight_order,
)
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.order import OrderError, order_indexes
from schedtrace.tracer.contract.schema import KvSnapshot, Pass, PoolLayout


class _NeverAllocates:
    """What the stand-in pools share: no tensors, and every allocation refused."""

    what = "KV"

    def _no_tensors(self, page_size: int) -> None:
        """The attributes sglang's allocator base sets, without building a pool."""
        self.page_size = page_size
        self.dtype = None
        self.device = "cpu"
        self._kvcache = None
        self.need_sort = False
        self.free_pages = self.release_pages = self.free_group = None

    def clear(self) -> None:
        raise ReplayStateError(f"replay never allocates {self.what}")

    def alloc(self, need_size: int):
        raise ReplayStateError(f"replay never allocates {self.what}")

    def free(self, free_index) -> None:
        raise ReplayStateError(f"replay never frees {self.what}")


class RecordedAllocator(_NeverAllocates, BaseTokenToKVPoolAllocator):
    """A KV allocator that reports the recorded free count and never allocates."""

    def __init__(self, size: int, page_size: int) -> None:  # noqa: D107 - no super(): no tensors
        self.size = size
        self._no_tensors(page_size)
        self.available = 0

    def load(self, kv: KvSnapshot) -> None:
        self.available = kv.available

    def available_size(self) -> int:
        return self.available

    def capacity(self, tree_cache: RecordedTreeCache) -> tuple[int, int | None]:
        """(full, SWA) tokens an allocation can get now: free plus evictable."""
        return self.available + tree_cache.evictable, None


class RecordedSWAAllocator(_NeverAllocates, SWATokenToKVPoolAllocator):
    """sglang's SWA allocator over two recorded sides; it never allocates.

    Only the attributes its capacity methods read are set (no ``super()``:
    no tensors): the real ``available_size`` (the smaller side, or the full
    side under a per-request ring), ``full_available_size``,
    ``swa_available_size`` (free request slots times the ring under a ring),
    ``size_swa`` and ``create_prefill_budget`` run as in the server.
    """

    def __init__(self, layout: PoolLayout, page_size: int, req_slots: RecordedReqSlots) -> None:  # noqa: D107
        self._size_full = layout.full_size
        self._size_swa = layout.swa_size or 0
        self._no_tensors(page_size)
        self.full_attn_allocator = RecordedAllocator(self._size_full, page_size)
        self.swa_attn_allocator = RecordedAllocator(self._size_swa, page_size)
        self._swa_req_ring = layout.swa_ring_cost > 0
        self._swa_ring_cost = layout.swa_ring_cost
        self._req_to_token_pool = req_slots

    def load(self, kv: KvSnapshot) -> None:
        if kv.swa_available is None and not self._swa_req_ring:
            raise ReplayStateError("SWA trace: a pass without the SWA pool's free count (kv.swa_available)")
        self.full_attn_allocator.available = kv.available
        self.swa_attn_allocator.available = kv.swa_available or 0

    def capacity(self, tree_cache: RecordedTreeCache) -> tuple[int, int | None]:
        full = self.full_available_size() + tree_cache.evictable
        if self._swa_req_ring:
            return full, None  # ring rows are held per request slot, not allocated per token
        return full, self.swa_available_size() + tree_cache.swa_evictable


@dataclass(eq=False)
class PrefixNode:
    """The matched prefix of one request.

    ``tokens`` is the match length. Locking it moves ``evictable_share``
    tokens out of the evictable count (the recorded drop; ``None``: all of
    ``tokens``, as far as the count allows) into ``held``; the last unlock
    gives ``held`` back, as the radix cache's ``dec_lock_ref`` does.
    """

    tokens: int
    lock_ref: int = 0
    evictable_share: int | None = None
    held: int = 0
    swa_share: int | None = None  # the SWA side of the same (SWA trees only)
    swa_held: int = 0
    key: Any = None  # the RadixKey it matched (dfs-weight rebuilds the tree from these)


class RecordedTreeCache(BasePrefixCache):
    """A prefix cache that answers the recorded matches and evictable count."""

    def __init__(
        self,
        *,
        disable: bool,
        page_size: int,
        allocator: RecordedAllocator | RecordedSWAAllocator,
        req_slots: Any,
        mamba: bool = False,
        sliding_window: int | None = None,
        prefix_block: int = 0,
    ) -> None:
        self.disable = disable
        self.prefix_block = prefix_block  # Header.prefix_block (dfs_weight_order's partial blocks)
        self.page_size = page_size
        self.token_to_kv_pool_allocator = allocator
        self.req_to_token_pool = req_slots
        self.root_node = PrefixNode(0)
        self.is_mamba = mamba  # a FULL+MAMBA tree (supports_mamba)
        self.is_swa = isinstance(allocator, RecordedSWAAllocator)  # a FULL+SWA tree
        self._sliding_window_size = sliding_window if self.is_swa else None
        self.evictable = 0
        self.swa_evictable = 0
        self.mamba_evictable = 0
        self.prefix_by_rid: dict[str, int] = {}
        self.locked_by_rid: dict[str, int] = {}
        self.swa_locked_by_rid: dict[str, int] = {}
        self.nodes: dict[str, PrefixNode] = {}
        self._rows: Pass | None = None  # load_pass's pass, until its maps are built
        self.recorded_order: list[int] | None = None  # the pass's Pass.order (dfs-weight's tie-break)

    def load(
        self,
        evictable: int,
        prefix_by_rid: dict[str, int],
        locked_by_rid: dict[str, int] | None = None,
        *,
        swa_evictable: int = 0,
        mamba_evictable: int = 0,
        swa_locked_by_rid: dict[str, int] | None = None,
    ) -> None:
        """One pass's cache: evictable counts, prefix match per rid and, where
        recorded, how many evictable tokens locking that match took (per side)."""
        self.evictable = evictable
        self.swa_evictable = swa_evictable
        self.mamba_evictable = mamba_evictable
        self.prefix_by_rid = prefix_by_rid
        self.locked_by_rid = locked_by_rid or {}
        self.swa_locked_by_rid = swa_locked_by_rid or {}
        self.nodes = {}
        self._rows = None

    def load_pass(self, p: Pass) -> None:
        """``load`` from a pass's rows; the per-rid maps are built at the first match, which most
        passes (a latched or full batch) never make."""
        kv = p.kv
        self.load(kv.evictable, {}, swa_evictable=kv.swa_evictable or 0, mamba_evictable=kv.mamba_evictable or 0)
        self._rows = p

    def _build_maps(self) -> None:
        p, self._rows = self._rows, None
        self.prefix_by_rid = {w.rid: w.prefix_len for w in p.waiting}
        self.locked_by_rid = {c.rid: c.locked_evictable for c in p.candidates if c.locked_evictable is not None}
        self.swa_locked_by_rid = {
            c.rid: c.locked_swa_evictable for c in p.candidates if c.locked_swa_evictable is not None}

    # --- what the scheduler asks ---

    def match_prefix(self, params) -> MatchResult:
        if self._rows is not None:
            self._build_maps()
        req = params.req
        rid = req.rid if req is not None else None
        prefix = 0 if self.disable else self.prefix_by_rid.get(rid, 0)
        if params.key is not None:
            prefix = min(prefix, len(params.key))  # the key limit caps a match
        node = self.nodes.get(rid) if rid is not None else None
        if node is None or node.tokens != prefix:
            if prefix == 0:
                node = self.root_node
            else:
                share = self.locked_by_rid.get(rid)
                if share is not None:
                    share = min(share, prefix)  # a key-capped match can hold no more
                swa_share = self.swa_locked_by_rid.get(rid)
                if swa_share is not None:
                    swa_share = min(swa_share, prefix)
                node = PrefixNode(prefix, evictable_share=share, swa_share=swa_share, key=params.key)
            if rid is not None and prefix:
                self.nodes[rid] = node
        return MatchResult(
            device_prefix_len=prefix,
            last_device_node=node,
            last_host_node=node,
            best_match_node=node,
        )

    def inc_lock_ref(self, node: PrefixNode) -> IncLockRefResult:
        if self.disable or node is self.root_node:
            return IncLockRefResult(delta=0)
        delta = 0
        if node.lock_ref == 0:
            # The real radix cache moves every unlocked node on the path from
            # evictable to protected: the recorded drop says how many tokens
            # that was; without it, the whole match, as far as the count allows.
            share = node.tokens if node.evictable_share is None else node.evictable_share
            node.held = min(share, self.evictable)
            delta = -node.held
            self.evictable -= node.held
            if self.is_swa:
                # The SWA component pins the prefix's trailing window: the recorded drop,
                # else the whole window (what it pins of a prefix no one else locks).
                swa_share = node.swa_share
                if swa_share is None:
                    swa_share = min(node.tokens, self._sliding_window_size or node.tokens)
                node.swa_held = min(swa_share, self.swa_evictable)
                self.swa_evictable -= node.swa_held
        node.lock_ref += 1
        return IncLockRefResult(delta=delta)

    def dec_lock_ref(self, node: PrefixNode, params=None) -> DecLockRefResult:
        if self.disable or node is self.root_node:
            return DecLockRefResult(delta=0)
        delta = 0
        if node.lock_ref == 1:
            delta = node.held
            self.evictable += delta
            node.held = 0
            self.swa_evictable += node.swa_held
            node.swa_held = 0
        node.lock_ref -= 1
        return DecLockRefResult(delta=delta)

    def dfs_weight_order(self, node_handles) -> list[int]:
        """sglang's own dfs-weight walk (``_dfs_weight_order``) over sglang's own ``RadixCache``,
        built from the matched prefixes: the part of the server's tree the walk weighs."""
        return dfs_weight_order(self.root_node, node_handles, self.recorded_order, self.prefix_block)

    def evictable_size(self) -> int:
        return self.evictable

    def full_evictable_size(self) -> int:
        return self.evictable

    def swa_evictable_size(self) -> int:
        return self.swa_evictable

    def mamba_evictable_size(self) -> int:
        return self.mamba_evictable

    def protected_size(self) -> int:
        return 0

    @property
    def sliding_window_size(self) -> int | None:
        return self._sliding_window_size

    def supports_swa(self) -> bool:
        return self.is_swa

    def supports_mamba(self) -> bool:
        return self.is_mamba

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    # --- never reached before admission ends ---

    def reset(self) -> None:
        self.load(0, {})

    def checkpoint(self, req, *, up_to: int, **kwargs):
        raise ReplayStateError("replay stops before the prefix cache is written")

    def evict(self, params) -> EvictResult:
        raise ReplayStateError("replay stops before eviction")


def dfs_weight_order(root: PrefixNode, handles: list, recorded: list[int] | None = None, block: int = 0) -> list[int]:
    """``BasePrefixCache.dfs_weight_order`` for ``PrefixNode`` handles: each matched prefix is
    inserted into a simulated ``RadixCache`` and sglang's walk runs on it.

    The walk breaks a tie between sibling subtrees by the order the server's tree
    created them, history a trace does not hold; the prefixes go in in the
    recorded order (``Pass.order``, else queue order), which makes a tie fall the
    way the server's did, while the weights and the shape are the tree's own.

    Ids name whole blocks of ``block`` tokens, so where two requests' ids first differ,
    at a block, the tokens they still shared inside it are unknown (a 600-token system
    prompt ends 8 tokens into block 37 of 16). ``block_shifted`` keys each block by the
    one before it, so the two share that block as far as both matched: a match of 600
    ends on the path of a longer one, as in the server's tree.
    """
    tree = RadixCache.create_simulated()
    try:
        indexes = order_indexes(recorded, len(handles))
    except OrderError:
        indexes = list(range(len(handles)))
    keys: dict[int, RadixKey] = {}
    for node in (handles[i] for i in indexes):
        if node is root or node.tokens == 0 or id(node) in keys:
            continue
        key = node.key
        keys[id(node)] = prefix = RadixKey(block_shifted(key.token_ids[: node.tokens], block),
                                           extra_key=key.extra_key, cache_salt=getattr(key, "cache_salt", None))
        tree.insert(InsertParams(key=prefix, value=torch.empty(node.tokens, dtype=torch.bool)))
    tree_nodes = {i: tree.match_prefix(MatchPrefixParams(key=k)).last_device_node for i, k in keys.items()}

    def resolve(node: PrefixNode):
        return tree_nodes.get(id(node), tree.root_node)

    return _dfs_weight_order(tree.root_node, handles, resolve)


def block_shifted(tokens, block: int):
    """``tokens`` with every block after the first taking the value of the block before it
    (its id's chain up to there); unchanged without ids (``block`` 0)."""
    if block <= 0 or len(tokens) <= block:
        return tokens
    values = np.asarray(tokens, dtype=np.int64)
    shifted = values.copy()
    shifted[block:] = values[np.arange(block, len(values)) // block * block - 1]
    if isinstance(tokens, array):
        return array(tokens.typecode, shifted.tobytes())
    return shifted.tolist()


class RecordedReqSlots:
    """The req_to_token pool: only its free row count is read before admission ends."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = 0

    def load(self, free: int, kv: KvSnapshot) -> None:
        self.free = free

    def available_size(self) -> int:
        return self.free


class RecordedMambaSlots(_NeverAllocates, MambaSlotAllocator):
    """sglang's mamba state-slot allocator reporting the recorded free slots.

    No ``super()`` (it would build a slot tensor); ``schedulable_available_size``
    is sglang's. The pass's slot group (``alloc_group_begin``/``end``) takes
    nothing, since replay stops before any request binds a slot.
    """

    what = "mamba state"

    def __init__(self, size: int) -> None:  # noqa: D107
        self.size = size
        self.device = "cpu"
        self._alloc_iter = None
        self.available = 0

    def available_size(self) -> int:
        return self.available

    def alloc_group_begin(self, num_reqs: int) -> None:
        pass

    def alloc_group_end(self) -> None:
        pass


class RecordedHybridReqSlots(RecordedReqSlots):
    """A ``HybridReqToTokenPool``: request rows plus the mamba state slots."""

    def __init__(self, size: int, mamba_size: int) -> None:
        super().__init__(size)
        self.mamba_allocator = RecordedMambaSlots(mamba_size)

    def load(self, free: int, kv: KvSnapshot) -> None:
        if kv.mamba_available is None:
            raise ReplayStateError("mamba trace: a pass without the free mamba state slots (kv.mamba_available)")
        self.free = free
        self.mamba_allocator.available = kv.mamba_available
