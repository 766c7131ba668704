"""Drives the recorder hooks over a real sglang pass; used by the bench and the tests.

* ``HookPoints``: every hook point one pass runs through (``targets.PASS_TARGETS``)
  wrapped as ``HookRegistry`` wraps an AROUND hook, installed and put back
  per call: the bare functions, a pass-through hook, or the recorder's hooks;
* ``header``, ``loaded_pass``, ``load``: a pass record (32 waiting, 12
  running) loaded into real sglang state by a pass driver (replay's
  ``PassDriver``, passed in: the recorder does not import the replayer);
* ``hybrid_pools``: sglang's pools for a mamba or a sliding-window model, at
  the rig's sizes of a layer;
* ``RealPools``: the pass as close to a live CPU server's as a rig can get.
  A real ``ReqToTokenPool``, a real (one layer, one head) CPU
  ``MHATokenToKVPool`` of the server's ``max_total_tokens``, the real
  ``TokenToKVPoolAllocator`` over it and the prefix cache sglang builds for a
  plain model, a ``UnifiedRadixCache`` (the policy uses it too). The tree
  holds three system prompts and a few finished requests; the running
  requests hold their rows and KV and pin the first prompt, and every other
  waiting request starts with one of the prompts: the pass admits 8 (the
  eighth as a truncated chunk), 4 of them on a cached prompt, so admission
  locks non-root nodes, two already pinned and two not. Not live: the model
  config is ``LightModelConfig`` (a real ``ModelConfig`` needs a HF model
  directory), the scheduler object is the driver's stand-in, and no forward
  follows.

sglang and torch are imported only when a rig object is made, so importing
the recorder package stays cheap.
"""

from __future__ import annotations

import contextlib
import importlib
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any, Protocol

from schedtrace.tracer.contract.schema import Header, KvSnapshot, Pass, RunningReq, ServerArgs, WaitingReq
from schedtrace.tracer.recorder.targets import PASS_TARGETS, Hook

WAITING, RUNNING = 32, 12

# (owner, attribute, function) to set: one arm of the hook points.
Points = list[tuple[object, str, Callable[..., Any]]]


def pass_through(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The baseline AROUND hook: only calls through."""
    return original(*args, **kwargs)


class HookPoints:
    """The pass's hook points, resolved; each arm is a list of functions to install."""

    def __init__(self, targets: tuple[str, ...] = PASS_TARGETS) -> None:
        resolved = [(*_owner_of(target), target) for target in targets]
        self._targets = {(owner, name): target for owner, name, target in resolved}
        # Only methods the class defines itself: an inherited one is wrapped on its base.
        self.bare: Points = [(owner, name, owner.__dict__[name]) for owner, name, _ in resolved if name in owner.__dict__]

    def wrapped(self, hooks: Mapping[str, Hook]) -> Points:
        """Every hook point wrapped as HookRegistry would, by its target's hook."""
        from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

        return [(owner, name, _wrapped(fn, hooks[self._targets[owner, name]], _wrap_fn, HookType.AROUND))
                for owner, name, fn in self.bare]

    def passing_through(self) -> Points:
        return self.wrapped({target: pass_through for target in self._targets.values()})

    @staticmethod
    def install(points: Points) -> None:
        for owner, name, fn in points:
            setattr(owner, name, fn)

    def restore(self) -> None:
        self.install(self.bare)

    @contextlib.contextmanager
    def hooked(self, points: Points) -> Iterator[None]:
        self.install(points)
        try:
            yield
        finally:
            self.restore()


def _wrapped(fn: Any, hook: Hook, wrap: Callable, around: Any) -> Any:
    """``fn`` wrapped by ``hook``, a classmethod kept one, as HookRegistry keeps it."""
    if isinstance(fn, classmethod):
        return classmethod(wrap(fn.__func__, hook, around))
    return wrap(fn, hook, around)


def _owner_of(target: str) -> tuple[object, str]:
    """(class, method name) of a dotted ``module.Class.method`` hook target."""
    owner_path, name = target.rsplit(".", 1)
    module, cls = owner_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls), name


# --- the pass record and its loading ------------------------------------------


def server_args() -> ServerArgs:
    return ServerArgs("fcfs", 8192, 16384, 1, 48, 400_000, "torch_native", "bench")


def header() -> Header:
    return Header(1, "?", "?", "bench", 0, 0, None, 0, server_args(), max_req_slots=64)


def loaded_pass(batch_full: bool) -> Pass:
    waiting = [WaitingReq(f"w-{i:03d}", 1500 + 37 * i, 0, 256, 0, None, True) for i in range(WAITING)]
    running = [RunningReq(f"r-{i:03d}", 2000 + 11 * i, 1 + 5 * i, 256, True) for i in range(RUNNING)]
    return Pass(0, 0, 0, 1, 0, waiting, running, None, batch_full, KvSnapshot(300_000, 512), 40, 0.7, 8192,
                [], [], None, None, batch_full)


def idle_pass() -> Pass:
    return Pass(0, 0, 0, 1, 0, [], [], None, False, KvSnapshot(1000, 0), 40, 0.7, 8192, [], [], None, None, False)


class PassLoader(Protocol):
    """What the rig uses of replay's ``PassDriver``."""

    scheduler: Any

    def _load(self, p: Pass) -> tuple[list, Any, Any]: ...


def prepare_scheduler(driver: PassLoader) -> None:
    """Attributes the admitting path reads after ``init_new``."""
    s = driver.scheduler
    s.hisparse_coordinator = None
    s.enable_hierarchical_cache = False
    s.enable_unified_cache_external_linker = False
    s.enable_priority_scheduling = False
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)


def set_pass_inputs(s: Any, waiting: list, chunked: Any, record: Pass) -> None:
    """The scheduler state a pass reads besides the pools."""
    s.waiting_queue = waiting
    s.chunked_req = chunked
    s.chunked_prefill_size = record.chunked_prefill_size
    s.new_token_ratio_tracker = SimpleNamespace(current=record.new_token_ratio)


def load(driver: PassLoader, record: Pass) -> tuple[Any, Any]:
    """(scheduler, running batch) of ``record``, on the driver's scheduler."""
    waiting, batch, chunked = driver._load(record)
    s = driver.scheduler
    set_pass_inputs(s, waiting, chunked, record)
    return s, batch


@contextlib.contextmanager
def attributes(obj: Any, values: dict[str, Any]) -> Iterator[None]:
    """``values`` set on ``obj`` inside the block, the old ones put back after."""
    saved = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)


# --- real pools ------------------------------------------------------------------

CONTEXT_LEN = 8192  # req_to_token row width: above every rig request's length
# The pass only moves KV indices, never KV data: the smallest real pool will do.
KV_LAYERS, KV_HEADS, KV_HEAD_DIM = 1, 1, 8
SYSTEM_PROMPT_LENS = (1024, 512, 768)  # cached prefixes shared by waiting (and running) requests
FINISHED_IN_CACHE, FINISHED_LEN = 8, 2000  # finished requests' KV left in the tree: evictable
VOCAB = 32000


@dataclass(frozen=True)
class LightModelConfig:
    """The ``ModelConfig`` fields the admitting pass reads (``init_new``,
    ``prepare_for_extend``, ``SamplingBatchInfo``) for a text-only model
    without mamba layers. A real ``ModelConfig`` loads a HF model directory."""

    vocab_size: int = VOCAB
    is_encoder_decoder: bool = False


def _tokens(first: int, n: int) -> array:
    """``n`` tokens of id ``first``: each sequence gets an id of its own, so
    prefixes are shared only where a system prompt is put in front."""
    return array("q", [first]) * n


def _req(rid: str, tokens: array, max_new: int, order: int) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", tokens, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
    req.time_stats.wait_queue_entry_time = float(order)  # FCFS order
    return req


MAMBA_CHUNK = 64  # the mamba cache chunk size a dummy model cannot supply (sglang's own test kit presets it)


def hybrid_pools(family: str, *, kv_size: int, slots: int, swa_size: int = 0, window: int | None = None,
                 mamba_slots: int = 0) -> tuple[Any, Any, Any]:
    """(req_to_token_pool, allocator, tree_cache) as sglang builds them for ``family``
    ("mamba" or "swa"): one full-attention layer and one linear-attention (mamba) or
    sliding-window layer, at the rig's head shape. Call inside a pass driver's published
    config: the mamba tree reads the server args."""
    import torch
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool, ReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_server_args

    head = dict(dtype=torch.float32, page_size=1, head_num=KV_HEADS, head_dim=KV_HEAD_DIM, device="cpu")
    if family == "mamba":
        from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

        get_server_args()._mamba_cache_chunk_size = MAMBA_CHUNK
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2,
                                        head_dim=16, state_size=8, conv_kernel=4)
        req_pool = HybridReqToTokenPool(
            size=slots, mamba_size=mamba_slots, mamba_spec_state_size=slots, max_context_len=CONTEXT_LEN,
            device="cpu", enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0]),
            mamba_layer_ids=[0], enable_mamba_extra_buffer=False, enable_overlap_schedule=False,
        )
        kv_pool = HybridLinearKVPool(size=kv_size, full_attention_layer_ids=[1], mamba_pool=req_pool.mamba_pool,
                                     enable_memory_saver=False, **head)
        allocator = TokenToKVPoolAllocator(kv_size, torch.float32, "cpu", kv_pool, need_sort=False)
        components, window = (ComponentType.FULL, ComponentType.MAMBA), None
    else:
        req_pool = ReqToTokenPool(slots, CONTEXT_LEN, "cpu", enable_memory_saver=False)
        kv_pool = SWAKVPool(size=kv_size, size_swa=swa_size, swa_attention_layer_ids=[0],
                            full_attention_layer_ids=[1], **head)
        allocator = SWATokenToKVPoolAllocator(kv_size, swa_size, 1, torch.float32, "cpu", kv_pool, need_sort=False)
        components = (ComponentType.FULL, ComponentType.SWA)
    tree = UnifiedRadixCache(CacheInitParams(
        disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=allocator, page_size=1,
        sliding_window_size=window, tree_components=components,
    ))
    return req_pool, allocator, tree


class RealPools:
    """Real request-slot pool, KV pool and allocator, and a radix tree over
    them, put back into one state before each pass (``reset``)."""

    def __init__(self, args: ServerArgs, slots: int) -> None:
        import torch
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        size = args.max_total_tokens
        kv_pool = MHATokenToKVPool(
            size, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=KV_HEAD_DIM,
            layer_num=KV_LAYERS, device="cpu", enable_memory_saver=False,
        )
        self.allocator = TokenToKVPoolAllocator(size, torch.float32, "cpu", kv_pool, need_sort=False)
        self.req_to_token_pool = ReqToTokenPool(slots, CONTEXT_LEN, "cpu", enable_memory_saver=False)
        # What sglang's default_radix_cache_factory builds for a plain (no SWA, no mamba) model.
        self.tree_cache = UnifiedRadixCache(CacheInitParams(
            disable=False, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=1, tree_components=(ComponentType.FULL,),
        ))
        self.policy = SchedulePolicy(
            args.schedule_policy, self.tree_cache, enable_hierarchical_cache=False,
            enable_priority_scheduling=False, schedule_low_priority_values_first=False,
        )
        self.prompts = [_tokens(100 + k, n) for k, n in enumerate(SYSTEM_PROMPT_LENS)]
        self.record = loaded_pass(batch_full=False)

    def scheduler_attributes(self, s: Any) -> dict[str, Any]:
        """What the real pass reads on the scheduler beyond the driver's stand-in setup."""
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return {
            "tree_cache": self.tree_cache,
            "token_to_kv_pool_allocator": self.allocator,
            "req_to_token_pool": self.req_to_token_pool,
            "policy": self.policy,
            # sglang's own; PassDriver's wraps each adder's chunk budget to read it back.
            "get_prefill_adder_class": MethodType(Scheduler.get_prefill_adder_class, s),
            "model_config": LightModelConfig(),
            "enable_overlap": False,
            "spec_algorithm": SpeculativeAlgorithm.NONE,
        }

    def _cache(self, tokens: array) -> Any:
        """Insert ``tokens`` into the tree on fresh KV, as a finished prefill
        leaves them (KV of an already cached prefix is given back); returns the last node."""
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        kv = self.allocator.alloc(len(tokens))
        result = self.tree_cache.insert(InsertParams(key=RadixKey(tokens), value=kv))
        self.allocator.free(kv[: result.prefix_len])
        return result.last_device_node

    def _running(self) -> list:
        """Running requests on the first system prompt: each holds a row, its
        input in the tree (locked, as its prefill left it) and its decode KV."""
        prompt = self.prompts[0]
        rows = self.req_to_token_pool.alloc_rows(len(self.record.running))
        running = []
        for n, (r, row) in enumerate(zip(self.record.running, rows)):
            req = _req(r.rid, prompt + _tokens(30_000 + n, r.input_len - len(prompt)), r.max_new_tokens, 0)
            req.output_ids = [1] * r.output_len
            self.tree_cache.lock(self._cache(req.origin_input_ids))
            self.allocator.alloc(r.output_len)
            req.kv.req_pool_idx = row
            req.kv.cache_protected_len = r.input_len
            req.kv.kv_committed_len = req.kv.kv_allocated_len = r.input_len + r.output_len
            running.append(req)
        return running

    def _waiting(self) -> list:
        """Every other waiting request starts with a system prompt."""
        waiting = []
        for n, w in enumerate(self.record.waiting):
            prefix = self.prompts[(n // 2) % len(self.prompts)] if n % 2 == 0 else array("q")
            tokens = prefix + _tokens(10_000 + n, w.input_len - len(prefix))
            waiting.append(_req(w.rid, tokens, w.max_new_tokens, n))
        return waiting

    def reset(self, s: Any) -> Any:
        """Empty pools and tree, then the rig state; returns the running batch."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.allocator.clear()
        self.req_to_token_pool.clear()
        self.tree_cache.reset()
        for prompt in self.prompts:
            self._cache(prompt)
        for f in range(FINISHED_IN_CACHE):
            self._cache(_tokens(20_000 + f, FINISHED_LEN))
        running = self._running()
        set_pass_inputs(s, self._waiting(), None, self.record)
        return ScheduleBatch(reqs=running, batch_is_full=False)
