"""The fixed parts of an emitted test, as source text: imports, stand-ins, the pass runner.

An emitted test imports only sglang, pytest and the standard library, so
what replay does with ``schedtrace.replay.state`` and ``driver`` is written
out here in the small form one pass needs: a KV pool, a prefix cache and a
request pool that answer the recorded counts (the three stores whose
contents a trace does not hold), real ``Req``, ``ScheduleBatch``,
``SchedulePolicy`` and ``Scheduler.__new__`` for the rest. ``sgl_kernel``
needs libcuda; sglang's own ``maybe_stub_sgl_kernel`` (its CPU unit tests'
stand-in) is called before the first sglang import that needs it.

``emit`` fills in the constants and the test; ``verify`` proves the whole
fails on stock and passes with the fix.
"""

from __future__ import annotations

STUB = '''
from sglang.test.test_utils import maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # sgl_kernel needs libcuda; nothing here calls a kernel
'''

PASS_IMPORTS = (
    "from sglang.srt.managers.schedule_batch import Req, ScheduleBatch",
    "from sglang.srt.managers.schedule_policy import SchedulePolicy",
    "from sglang.srt.managers.scheduler import Scheduler",
    "from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator",
    "from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache, DecLockRefResult, IncLockRefResult, MatchResult",
    "from sglang.srt.runtime_context import get_context",
    "from sglang.srt.sampling.sampling_params import SamplingParams",
)
PASS_STDLIB = ("import itertools", "from array import array", "from types import SimpleNamespace",
               "from typing import NamedTuple")
GRID_IMPORT = "from sglang.srt.managers import schedule_policy"

AITER_IMPORTS = (
    "from sglang.srt.model_executor.forward_batch_info import ForwardMode",
    "from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import context as breakable_graph",
    "from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import context_manager as piecewise_graph",
    "from sglang.srt.models.deepseek_common.attention_backend_handler import handle_attention_aiter",
)

OUTCOME = '''
class Outcome(NamedTuple):
    """What one scheduling pass decided."""

    admitted: list[tuple[str, int]]  # (rid, extend tokens) in admission order
    batch_is_full: bool  # running_batch.batch_is_full after the pass
    new_chunked_rid: str | None  # a request that became the chunked request this pass
    error: str | None  # "Type: message" if the pass raised
'''

FREE_KV = '''
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
'''

EVICTABLE_ONLY_CACHE = '''
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
'''

PREFIX_CACHE = '''
class CachedPrefix:
    """One request's matched prefix; locking it pins ``held`` tokens out of the evictable count."""

    def __init__(self, tokens: int, evictable_share: int | None) -> None:
        self.tokens, self.evictable_share, self.lock_ref, self.held = tokens, evictable_share, 0, 0


class PrefixCache(EvictableOnlyCache):
    """The prefix cache with each request's cached prefix. Locking a prefix takes it (or the
    recorded share of it still evictable) out of the evictable count, as the radix cache does."""

    def __init__(self, evictable_tokens: int, prefixes: dict[str, int], shares: dict[str, int]) -> None:
        super().__init__(evictable_tokens)
        self.prefixes, self.shares, self.nodes = prefixes, shares, {}
        self.root_node = CachedPrefix(0, 0)

    def match_prefix(self, params) -> MatchResult:
        rid = params.req.rid if params.req is not None else None
        length = 0 if self.disable else self.prefixes.get(rid, 0)
        if params.key is not None:
            length = min(length, len(params.key))
        node = self.nodes.get(rid)
        if node is None or node.tokens != length:
            share = self.shares.get(rid)
            node = self.root_node if length == 0 else CachedPrefix(length, None if share is None else min(share, length))
            if length:
                self.nodes[rid] = node
        return MatchResult(device_prefix_len=length, last_device_node=node, last_host_node=node, best_match_node=node)

    def inc_lock_ref(self, node) -> IncLockRefResult:
        if self.disable or node is self.root_node:
            return IncLockRefResult(delta=0)
        delta = 0
        if node.lock_ref == 0:
            share = node.tokens if node.evictable_share is None else node.evictable_share
            node.held = min(share, self.evictable_tokens)
            self.evictable_tokens -= node.held
            delta = -node.held
        node.lock_ref += 1
        return IncLockRefResult(delta=delta)

    def dec_lock_ref(self, node, params=None) -> DecLockRefResult:
        if self.disable or node is self.root_node:
            return DecLockRefResult(delta=0)
        delta = 0
        if node.lock_ref == 1:
            delta, node.held = node.held, 0
            self.evictable_tokens += delta
        node.lock_ref -= 1
        return DecLockRefResult(delta=delta)

    def supports_prefix_sharing(self) -> bool:
        return not self.disable
'''

FREE_ROWS = '''
class FreeRows:
    """The req_to_token pool as admission reads it: a count of free rows."""

    def __init__(self, free_rows: int) -> None:
        self.free_rows = free_rows

    def available_size(self) -> int:
        return self.free_rows
'''

MAKE_REQ = '''
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
'''

RETRACTED_REQ = '''
def retracted_req(rid: str, prompt: int, **kwargs) -> Req:
    """A request that decoded, was retracted to free KV, and waits again with its outputs."""
    req = make_req(rid, prompt, **kwargs)
    req.is_retracted = req.retracted_stain = True
    return req
'''

CHUNKED_REQ = '''
def chunked_req(rid: str, prompt: int, *, prefilled: int, **kwargs) -> Req:
    """The in-flight chunked request: ``prefilled`` of its tokens are in KV already."""
    req = running_req(rid, prompt, **kwargs)
    req.refresh_fill_ids()
    req.prefix_len = req.extend_end = req.kv.cache_protected_len = prefilled
    return req
'''

SCHEDULER = '''
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
'''

GRID_FIXTURE = '''
@pytest.fixture(autouse=True)
def chunk_grid(monkeypatch):
    """The mamba prefill chunk grid the recording host used (DCP with the mamba extra buffer)."""
    monkeypatch.setattr(schedule_policy, "mamba_prefill_chunk_grid", lambda: MAMBA_CHUNK_GRID)
'''

EXACT_FILL_FIXTURE = '''
@pytest.fixture(autouse=True)
def exact_chunk_fill(monkeypatch):
    """The recording host billed chunks exactly (SGLANG_EXACT_CHUNK_FILL on gfx95)."""
    monkeypatch.setattr(schedule_policy, "_use_exact_chunk_fill", lambda: True)
'''

FORWARD_BATCH = '''
class ForwardBatchLengths:
    """What handle_attention_aiter reads from a ForwardBatch: the mode, the lengths, the capacity."""

    def __init__(self, forward_mode, seq_lens_sum: int, max_chunk_capacity: int) -> None:
        self.forward_mode = forward_mode
        self.seq_lens_cpu = [seq_lens_sum]
        self.extend_prefix_lens_cpu = None
        self.max_chunk_capacity = max_chunk_capacity

    def get_max_chunk_capacity(self) -> int:
        return self.max_chunk_capacity
'''
