"""A latched batch_is_full must not keep the queue shut while KV and a request slot are free.

Found by schedtrace in traces/kv-pressure-lpm-24k.trace, pass 867 (admitted), and shrunk
by delta debugging (24 waiting, 8 running → 1 waiting, 1 running; kv 315/2980 → 0/4),
each step checked with the real sglang code. On that state stock sglang admits nothing,
batch_is_full set; with the latch fix (Scheduler._get_new_batch_prefill_raw) it admits
waiting-0 (1 token), batch_is_full clear.

Fails on sglang 0.5.23 as released; passes with the latch fix (`SCHEDTRACE_FIXES=latch
python -m pytest` applies it, with schedtrace installed). Recorded with sglang 0.5.23.
Imports only sglang, pytest and the standard library; runs on CPU.
"""

from __future__ import annotations

import itertools
from array import array
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from sglang.test.test_utils import maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # sgl_kernel needs libcuda; nothing here calls a kernel

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    BasePrefixCache,
    DecLockRefResult,
    IncLockRefResult,
    MatchResult,
)
from sglang.srt.runtime_context import get_context  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402


# The recording server's options
SCHEDULE_POLICY = "lpm"
PAGE_SIZE = 1
MAX_RUNNING_REQUESTS = 12
MICRO_BATCH_SIZE = MAX_RUNNING_REQUESTS  # pp_max_micro_batch_size, one pipeline stage
MAX_PREFILL_TOKENS = 16384
CHUNKED_PREFILL_SIZE = 8192
KV_POOL_TOKENS = 24000
DISABLE_RADIX_CACHE = False
ENABLE_MIXED_CHUNK = False
ENABLE_PRIORITY_SCHEDULING = False
TRUNCATION_ALIGN_SIZE = None

# The scheduler's state at the pass
FREE_KV_TOKENS = 0
EVICTABLE_KV_TOKENS = 4
FREE_REQ_SLOTS = 1
NEW_TOKEN_RATIO = 0.1
BATCH_IS_FULL = True


class Outcome(NamedTuple):
    """What one scheduling pass decided."""

    admitted: list[tuple[str, int]]  # (rid, extend tokens) in admission order
    batch_is_full: bool  # running_batch.batch_is_full after the pass
    new_chunked_rid: str | None  # a request that became the chunked request this pass
    error: str | None  # "Type: message" if the pass raised


class FreeKV(BaseTokenToKVPoolAllocator):
    """The KV pool as admission reads it: a count of free tokens. Nothing is allocated."""

    def __init__(self, free_tokens: int) -> None:
        self.size, self.page_size, self.free_tokens = KV_POOL_TOKENS, PAGE_SIZE, free_tokens
        self.dtype, self.device, self._kvcache, self.need_sort = None, "cpu", None, False
        self.free_pages = self.release_pages = self.free_group = None

    def available_size(self) -> int:
        return self.free_tokens

    def alloc(self, need_size):
        raise AssertionError("admission stops before KV is allocated")

    clear = free = alloc


class EvictableOnlyCache(BasePrefixCache):
    """The prefix cache as admission reads it: no request has a cached prefix; a count of evictable tokens."""

    def __init__(self, evictable_tokens: int) -> None:
        self.disable, self.page_size, self.evictable_tokens = DISABLE_RADIX_CACHE, PAGE_SIZE, evictable_tokens
        self.root_node = object()

    def match_prefix(self, params) -> MatchResult:
        root = self.root_node
        return MatchResult(device_prefix_len=0, last_device_node=root, last_host_node=root, best_match_node=root)

    def inc_lock_ref(self, node) -> IncLockRefResult:
        return IncLockRefResult(delta=0)

    def dec_lock_ref(self, node, params=None) -> DecLockRefResult:
        return DecLockRefResult(delta=0)

    def evictable_size(self) -> int:
        return self.evictable_tokens

    full_evictable_size = evictable_size

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def checkpoint(self, req, *, up_to, **kwargs):
        raise AssertionError("admission stops before the cache is written")

    evict = checkpoint


class FreeRows:
    """The req_to_token pool as admission reads it: a count of free rows."""

    def __init__(self, free_rows: int) -> None:
        self.free_rows = free_rows

    def available_size(self) -> int:
        return self.free_rows


TOKENS = itertools.count(1)  # one token id per request, so no two share a prefix


def make_req(rid: str, prompt: int, *, max_new: int, output: int = 0, ignore_eos: bool = False,
             priority: int | None = None) -> Req:
    """A request of ``prompt`` tokens that has generated ``output`` of at most ``max_new``."""
    token = next(TOKENS)
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    req = Req(rid, "", array("q", [token]) * prompt, params, priority=priority)
    req.output_ids = array("q", [token]) * output
    return req


def running_req(rid: str, prompt: int, **kwargs) -> Req:
    req = make_req(rid, prompt, **kwargs)
    req.kv.req_pool_idx = 0  # it holds a req_to_token row
    return req


def make_scheduler(tree_cache, allocator, req_pool) -> Scheduler:
    """``Scheduler.__new__`` with exactly the attributes one prefill pass reads."""
    s = Scheduler.__new__(Scheduler)
    s.grammar_manager = SimpleNamespace(has_waiting_grammars=lambda: False)
    s.enable_priority_preemption = s.is_hybrid_swa = s.enable_lora = False
    s.enable_hicache_storage = s.enable_lmcache = False
    s.is_mixed_chunk = ENABLE_MIXED_CHUNK
    s.min_free_slots_delayer = s.dynamic_chunk_sizer = s.dllm_config = None
    s.truncation_align_size = TRUNCATION_ALIGN_SIZE
    s.processed_tokens_counter = s.priority_scheduling_preemption_threshold = s.max_prefill_bs = 0
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=None))
    s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
    s.page_size, s.max_prefill_tokens, s.max_running_requests = PAGE_SIZE, MAX_PREFILL_TOKENS, MAX_RUNNING_REQUESTS
    s.chunked_prefill_size = CHUNKED_PREFILL_SIZE
    s.tree_cache, s.token_to_kv_pool_allocator, s.req_to_token_pool = tree_cache, allocator, req_pool
    s.policy = SchedulePolicy(SCHEDULE_POLICY, tree_cache, False, ENABLE_PRIORITY_SCHEDULING, False)
    s.new_token_ratio_tracker = SimpleNamespace(current=NEW_TOKEN_RATIO)
    s.model_config = s.spec_algorithm = None  # passed to ScheduleBatch.init_new, which run_pass stops
    s.enable_overlap = False
    return s


@pytest.fixture
def server_args():
    """The recording server's scheduling options, published as sglang's runtime config."""
    with get_context().override_server_args(
        pp_max_micro_batch_size=MICRO_BATCH_SIZE,
        schedule_policy=SCHEDULE_POLICY,
        page_size=PAGE_SIZE,
        enable_priority_scheduling=ENABLE_PRIORITY_SCHEDULING,
        disable_radix_cache=DISABLE_RADIX_CACHE,
    ):
        yield


class BatchBuilt(Exception):
    """Raised in place of ScheduleBatch.init_new: admission is over."""


def run_pass(monkeypatch, tree_cache, *, waiting, running, chunked=None) -> Outcome:
    """One real ``Scheduler._get_new_batch_prefill_raw`` pass on this state, stopped where it
    would build the batch (so nothing is allocated)."""
    scheduler = make_scheduler(tree_cache, FreeKV(FREE_KV_TOKENS), FreeRows(FREE_REQ_SLOTS))
    for order, req in enumerate(waiting):
        req.time_stats.wait_queue_entry_time = float(order)  # arrival order, for the policy's ties
    scheduler.waiting_queue = list(waiting)
    scheduler.chunked_req = chunked
    batch = ScheduleBatch(reqs=list(running), batch_is_full=BATCH_IS_FULL)

    def stop(cls, reqs, *args, **kwargs):
        raise BatchBuilt([(r.rid, r.extend_len) for r in reqs])

    monkeypatch.setattr(ScheduleBatch, "init_new", classmethod(stop))
    admitted, error = [], None
    try:
        scheduler._get_new_batch_prefill_raw(None, batch)
    except BatchBuilt as built:
        admitted = built.args[0]
    except Exception as exc:  # an exception inside the scheduler is the outcome under test
        error = f"{type(exc).__name__}: {exc}"
    after = scheduler.chunked_req
    new_chunked = after.rid if after is not None and after is not chunked else None
    return Outcome(admitted, bool(batch.batch_is_full) and error is None, new_chunked, error)


def test_latched_batch_is_full_still_admits(monkeypatch, server_args):
    """A latched batch_is_full must not keep the queue shut while KV and a request slot are free."""
    waiting = [make_req("waiting-0", 1, max_new=1)]
    running = [running_req("running-0", 1, max_new=1)]
    tree_cache = EvictableOnlyCache(EVICTABLE_KV_TOKENS)
    outcome = run_pass(monkeypatch, tree_cache, waiting=waiting, running=running)
    assert outcome.admitted == [("waiting-0", 1)], (
        f"admitted {outcome.admitted} with {FREE_KV_TOKENS} free and {EVICTABLE_KV_TOKENS} evictable KV tokens: "
        "a latched batch_is_full must not keep the queue shut while KV and a request slot are free"
    )
