"""Rebuild real sglang scheduling state from one recorded pass.

Real sglang objects everywhere the decision is made: ``Req`` (dummy token ids
of the recorded lengths), ``ScheduleBatch`` for the running batch,
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
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from schedtrace.replay.sglang_env import ensure_sglang_importable

ensure_sglang_importable()

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    BasePrefixCache,
    DecLockRefResult,
    EvictResult,
    IncLockRefResult,
    MatchResult,
)
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.schema import ChunkedReq, RunningReq, WaitingReq

# Row index given to the in-flight chunked request: it already holds a
# req_to_token row; the number itself is never read.
_HELD_ROW = 0


class RecordedAllocator(BaseTokenToKVPoolAllocator):
    """A KV allocator that reports the recorded free count and never allocates."""

    def __init__(self, size: int, page_size: int) -> None:  # noqa: D107 - no super(): no tensors
        self.size = size
        self.page_size = page_size
        self.dtype = None
        self.device = "cpu"
        self._kvcache = None
        self.need_sort = False
        self.free_pages = None
        self.release_pages = None
        self.free_group = None
        self.available = 0

    def available_size(self) -> int:
        return self.available

    def clear(self) -> None:
        raise ReplayStateError("replay never allocates KV")

    def alloc(self, need_size: int):
        raise ReplayStateError("replay never allocates KV")

    def free(self, free_index) -> None:
        raise ReplayStateError("replay never frees KV")


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


class RecordedTreeCache(BasePrefixCache):
    """A prefix cache that answers the recorded matches and evictable count."""

    def __init__(self, *, disable: bool, page_size: int, allocator: RecordedAllocator, req_slots: Any) -> None:
        self.disable = disable
        self.page_size = page_size
        self.token_to_kv_pool_allocator = allocator
        self.req_to_token_pool = req_slots
        self.root_node = PrefixNode(0)
        self.evictable = 0
        self.prefix_by_rid: dict[str, int] = {}
        self.locked_by_rid: dict[str, int] = {}
        self.nodes: dict[str, PrefixNode] = {}

    def load(
        self, evictable: int, prefix_by_rid: dict[str, int], locked_by_rid: dict[str, int] | None = None
    ) -> None:
        """One pass's cache: evictable count, prefix match per rid and, where
        recorded, how many evictable tokens locking that match took."""
        self.evictable = evictable
        self.prefix_by_rid = prefix_by_rid
        self.locked_by_rid = locked_by_rid or {}
        self.nodes = {}

    # --- what the scheduler asks ---

    def match_prefix(self, params) -> MatchResult:
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
                node = PrefixNode(prefix, evictable_share=share)
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
        node.lock_ref -= 1
        return DecLockRefResult(delta=delta)

    def evictable_size(self) -> int:
        return self.evictable

    def full_evictable_size(self) -> int:
        return self.evictable

    def protected_size(self) -> int:
        return 0

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    # --- never reached before admission ends ---

    def reset(self) -> None:
        self.load(0, {})

    def checkpoint(self, req, *, up_to: int, **kwargs):
        raise ReplayStateError("replay stops before the prefix cache is written")

    def evict(self, params) -> EvictResult:
        raise ReplayStateError("replay stops before eviction")


class RecordedReqSlots:
    """The req_to_token pool: only its free row count is read before admission ends."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = 0

    def available_size(self) -> int:
        return self.free


# --------------------------------------------------------------- requests


@dataclass
class TokenSource:
    """Dummy token ids: one distinct id per request, so no two share a prefix.

    Traces hold lengths, never token ids; an id of its own per request keeps
    the waiting-queue prefix matching of cache-aware policies from inventing
    shared prefixes the recording never had.
    """

    vocab: int = 30000
    ids: dict[str, int] = field(default_factory=dict)

    def token_for(self, rid: str) -> int:
        token = self.ids.get(rid)
        if token is None:
            token = self.ids[rid] = 1 + len(self.ids) % (self.vocab - 1)
        return token

    def tokens(self, rid: str, n: int) -> array:
        return array("q", [self.token_for(rid)]) * n


def _make_req(tokens: TokenSource, rid: str, input_len: int, output_len: int, max_new: int, ignore_eos: bool, priority: int | None = None) -> Req:
    if input_len < 0 or output_len < 0 or max_new < 0:
        raise ReplayStateError(f"request {rid!r}: negative length in the record")
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    req = Req(rid, "", tokens.tokens(rid, input_len), params, priority=priority)
    if output_len:
        req.output_ids = list(tokens.tokens(rid, output_len))
    return req


def waiting_req(tokens: TokenSource, w: WaitingReq, order: int) -> Req:
    req = _make_req(tokens, w.rid, w.input_len, w.output_len, w.max_new_tokens, w.ignore_eos, w.priority)
    # Queue order at pass entry is the arrival order the policies tie-break on.
    req.time_stats.wait_queue_entry_time = float(order)
    if w.output_len:
        req.is_retracted = True
        req.retracted_stain = True
    return req


def running_req(tokens: TokenSource, r: RunningReq) -> Req:
    req = _make_req(tokens, r.rid, r.input_len, r.output_len, r.max_new_tokens, r.ignore_eos)
    req.kv.req_pool_idx = _HELD_ROW
    return req


def chunked_req(tokens: TokenSource, c: ChunkedReq) -> Req:
    if not 0 <= c.prefix_len <= c.input_len + c.output_len:
        raise ReplayStateError(f"chunked request {c.rid!r}: prefix {c.prefix_len} outside its {c.input_len} tokens")
    req = _make_req(tokens, c.rid, c.input_len, c.output_len, c.max_new_tokens, c.ignore_eos)
    req.refresh_fill_ids()
    req.prefix_len = c.prefix_len
    req.extend_end = c.prefix_len
    req.kv.req_pool_idx = _HELD_ROW
    req.kv.cache_protected_len = c.prefix_len
    return req
