"""Each arm's own radix tree in a closed loop, keyed by the recorded prefix ids (``ArmTree``).

A counterfactual arm admits requests at other passes than the recording did,
so a request's cache hit is what *that arm's* tree holds when it is matched,
not what the recording's held then. The tree is sglang's own ``RadixCache``
(simulated: it holds no KV), one key element per prefix id, so two requests
share a path exactly as far as their ids agree (``Header.prefix_block``
tokens an id):

* the arm's prefills and chunks insert what they filled when their results
  are processed (``LoopReq.tree_len``, evolved by ``schedtrace.replay.loop.state``),
  and each request holding KV locks its path, as ``cache_unfinished_req`` and
  ``checkpoint`` move ``req.lock``; a finished request inserts its whole prompt
  and unlocks (``cache_finished_req``), a requeued one unlocks;
* eviction is the tree's own (``RadixCache.evict``: least recently used
  leaves first). How much goes is the loop's count: when the tree holds more
  evictable tokens than the loop's evictable count, the excess is evicted.
  What the tree does not see (decoded tokens, anything from before the
  recording) sits in the count too and so goes first;
* a fresh waiting request matches its ids on every pass (refreshing the
  path's recency, as a cache-aware policy's ``_compute_prefix_matches``
  does), and its match is the tree's, to the block. Within the last block
  the recording is exact where the tree is not: of the request's recorded
  matches, one that ends inside that block gives the token count.

Times are a counter, one tick per tree operation, not sglang's
``time.monotonic()``: the same trace and arm give the same evictions.
Full-pool trees only: a hybrid tree's match also needs the SWA or mamba
state at its node, which the loop takes from the recording as before.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from schedtrace.tracer.contract.names import SGLANG_RADIX_FORCE_MISS
from schedtrace.tracer.contract.prefix_ids import split_ids

if TYPE_CHECKING:
    from schedtrace.replay.loop.input import LoopInput
    from schedtrace.replay.loop.state import LoopReq, LoopState
    from schedtrace.tracer.contract.schema import Arrival

KEY_LIMIT: Final = 1 << 16  # ids a key holds: a hostile trace's id string cannot grow one without bound


class _NoKV:
    """The tree's allocator: a simulated tree holds no KV, so evicting frees nothing."""

    device = "cpu"

    def free_segment(self, *args, **kwargs) -> None:
        pass


class MatchHistory:
    """Each request's recorded prefix matches while fresh, by step (``LoopInput.matches``)."""

    def __init__(self, matches: Iterable[tuple[int, str, int, int | None]]) -> None:
        self.by_rid: dict[str, tuple[list[int], list[int]]] = {}
        for step, rid, prefix, _ in matches:
            if prefix > 0:
                steps, values = self.by_rid.setdefault(rid, ([], []))
                steps.append(step)
                values.append(prefix)

    def within(self, rid: str, low: int, high: int, step: int) -> int | None:
        """A recorded match in ``[low, high)``: the last one by ``step``, else the first after it."""
        steps, values = self.by_rid.get(rid, ((), ()))
        inside = [i for i, v in enumerate(values) if low <= v < high]
        if not inside:
            return None
        by_now = [i for i in inside if i < bisect_right(steps, step)]
        return values[by_now[-1] if by_now else inside[0]]


class ArmTree:
    """One arm's radix tree of prefix ids (see the module docstring)."""

    @staticmethod
    def applies(loop: LoopInput) -> bool:
        """Whether ``loop``'s arms keep their own trees: prefix ids and a full-pool radix cache that
        matches (under ``SGLANG_RADIX_FORCE_MISS`` every match misses, as the recording's did)."""
        header = loop.header
        return (header.prefix_block > 0 and loop.radix_cache and not header.is_hybrid_swa
                and not header.is_hybrid_mamba and not header.settings.get(SGLANG_RADIX_FORCE_MISS)
                and any(a.prefix_ids for a in loop.arrival_records))

    @classmethod
    def for_arm(cls, loop: LoopInput, state: LoopState) -> ArmTree | None:
        """The tree for one arm's loop from ``state``; None unless the trace has prefix ids and a
        full-pool radix cache (a hybrid tree's matches stay the recording's)."""
        if not cls.applies(loop):
            return None
        tree = cls(loop.header.prefix_block, loop.page_size, MatchHistory(loop.matches))
        tree.start(state, loop.ran_before)
        return tree

    def __init__(self, block: int, page_size: int, history: MatchHistory) -> None:
        from sglang.srt.mem_cache.radix_cache import RadixCache

        self.block = block
        self.page_size = page_size
        self.history = history
        self.tree = RadixCache.create_simulated(mock_allocator=_NoKV())
        self._tick = 0
        self._keys: dict[str, object] = {}  # rid -> its RadixKey of ids
        self._locked: dict[str, object] = {}  # rid -> the node its lock holds
        self._extent: dict[str, int] = {}  # rid -> ids of it inserted
        self._held: dict[str, LoopReq] = {}  # the requests holding KV after the last step
        self._pending: dict[str, int] = {}  # rid -> ids its prefill inserts with the first step's results

    # ------------------------------------------------------------ tree ops

    def _key(self, rid: str, ids: bytes):
        key = self._keys.get(rid)
        if key is None:
            from array import array

            from sglang.srt.mem_cache.radix_cache import RadixKey

            values = array("q", (int.from_bytes(b, "little", signed=True) for b in split_ids(ids)[:KEY_LIMIT]))
            key = self._keys[rid] = RadixKey(values)
        return key

    def _touch(self, node) -> None:
        """The path to ``node`` used now: sglang stamps it with the time, this with the next tick."""
        self._tick += 1
        root = self.tree.root_node
        while node is not None and node is not root:
            node.last_access_time = self._tick
            node = node.parent

    def _match(self, key, blocks: int | None = None):
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        found = self.tree.match_prefix(MatchPrefixParams(key=key if blocks is None else key[:blocks]))
        self._touch(found.last_device_node)
        return found

    def _insert(self, req: LoopReq, blocks: int) -> None:
        """``req``'s first ``blocks`` ids into the tree, and its lock on their path (kept where
        it has one that far already)."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams

        key = self._key(req.rid, req.prefix_ids)
        extent = self._extent.get(req.rid, 0)
        blocks = min(blocks, len(key))
        if blocks > extent:
            self.tree.insert(InsertParams(key=key[:blocks]))
            self._extent[req.rid] = extent = blocks
        elif req.rid in self._locked or not extent:
            return
        self._relock(req.rid, self._match(key, extent).last_device_node)

    def _relock(self, rid: str, node) -> None:
        old = self._locked.pop(rid, None)
        if node is not None:
            self.tree.inc_lock_ref(node)
            self._locked[rid] = node
        if old is not None:
            self.tree.dec_lock_ref(old)

    def _blocks(self, req: LoopReq, tokens: int) -> int:
        """Ids covering ``tokens`` of ``req``'s prompt: whole blocks, and the last, partial one
        once the whole prompt is in."""
        tokens = min(tokens, req.input_len)
        return tokens // self.block + (tokens == req.input_len and req.input_len % self.block > 0)

    # ------------------------------------------------------------ the loop's calls

    def start(self, state: LoopState, ran_before: Iterable[Arrival]) -> None:
        """The tree at the loop's start: the prompts of the requests that ran before it, what
        the requests holding KV prefilled (locked), and the waiting ones' recorded matches."""
        for arrival in ran_before:
            if arrival.prefix_ids:
                self._cache(arrival.rid, arrival.input_len, arrival.prefix_ids, arrival.input_len)
        chunked = state.chunked
        for req in state.held():
            if not req.prefix_ids:
                continue
            if req is chunked:
                self._insert(req, self._blocks(req, max(req.tree_len, req.prefix_len)))
            elif req.tree_landing and req.output_len > req.inflight:
                pass  # a parked micro-batch's prefill (no overlap): it lands when the loop processes it
            elif req.output_len > req.inflight:  # its prefill's result was processed: the prompt is in
                self._insert(req, self._blocks(req, req.input_len))
            else:  # under overlap, not yet: it lands with the first step's results
                if req.tree_len:  # what its admission found in the tree (settle_start)
                    self._insert(req, self._blocks(req, req.tree_len))
                self._pending[req.rid] = self._blocks(req, req.input_len)
            self._held[req.rid] = req
        for req in state.waiting:
            if req.prefix_ids and req.prefix_len > 0:
                self._cache(req.rid, req.input_len, req.prefix_ids, req.prefix_len - req.prefix_len % self.block)
        self._evict_to(state.evictable)

    def _cache(self, rid: str, input_len: int, ids: bytes, tokens: int) -> None:
        """``tokens`` of a prompt into the tree, locked by no request (cached: evictable)."""
        from schedtrace.replay.loop.state import LoopReq

        stand_in = LoopReq(rid, input_len, 0, 0, prefix_ids=ids)
        self._insert(stand_in, self._blocks(stand_in, tokens))
        self._relock(rid, None)
        self._extent.pop(rid, None)  # the request's own inserts, if it runs, start from none

    def match(self, state: LoopState, step: int) -> None:
        """Each fresh waiting request's match in this tree, into its ``prefix_len`` and
        ``prefix_cached``; the paths matched become the most recently used."""
        block = self.block
        for req in state.waiting:
            if req.output_len > 0 or not req.prefix_ids:
                continue  # a requeued request matches what it inserted itself (state._requeue)
            found = self._match(self._key(req.rid, req.prefix_ids))
            blocks = found.device_prefix_len
            tokens = min(blocks * block, req.input_len - 1)
            exact = self.history.within(req.rid, tokens, tokens + block, step)
            prefix = tokens if exact is None else min(exact, req.input_len - 1)
            prefix -= prefix % self.page_size
            protected = 0
            node, root = found.last_device_node, self.tree.root_node
            while node is not None and node is not root:
                if node.lock_ref > 0:
                    protected += len(node.key)
                node = node.parent
            # A lock holds a path from the root, so the protected part leads; where it is all of
            # the match, the tokens past its whole blocks are on a locked path too.
            req.prefix_len = prefix
            req.prefix_cached = None if not protected else 0 if protected >= blocks else prefix - protected * block

    def landed(self, state: LoopState, finished: Iterable[str]) -> None:
        """After a step: its inserts reach the tree, locks follow the requests holding KV
        (``finished``: the step's finishes, which insert their whole prompt first), and the tree
        evicts down to the loop's evictable count."""
        held = {r.rid: r for r in state.held() if r.prefix_ids}
        done = set(finished)
        for rid, blocks in self._pending.items():
            req = held.get(rid) or (self._held.get(rid) if rid in done else None)
            if req is not None:
                self._insert(req, blocks)
        self._pending.clear()
        for req in held.values():
            self._insert(req, self._blocks(req, req.tree_len))
        waiting = {r.rid for r in state.waiting}
        for rid in [rid for rid in self._locked if rid not in held]:
            last = self._held.get(rid)
            if rid in done and last is not None:
                self._insert(last, self._blocks(last, last.input_len))  # cache_finished_req: all of it
            self._relock(rid, None)
            if rid not in waiting:  # gone for good: its ids are the tree's now
                self._keys.pop(rid, None)
                self._extent.pop(rid, None)
        self._held = held
        self._evict_to(state.evictable)

    def _evict_to(self, evictable: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        excess = self.tree.evictable_size() * self.block - evictable
        if excess >= self.block:
            self.tree.evict(EvictParams(num_tokens=excess // self.block))
