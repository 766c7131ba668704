"""Recorder cost per scheduling pass, against a pass-through hook, same run.

Runs the real ``Scheduler._get_new_batch_prefill_raw`` (and the real
``PrefillAdder``/``PrefillBudget`` it builds) on a scheduler that
``schedtrace.replay.driver.PassDriver`` sets up from one pass record: real ``Req``
objects, a real ``ScheduleBatch``, real policy. The scheduler itself is
``Scheduler.__new__`` with the attributes the pass reads (no model, no
forward). Three arms, every hook point of the pass wrapped by HookRegistry's
AROUND wrapper in the last two (``PASS_TARGETS``: the pass, the adder and
budget methods, the allocator methods and the tree caches' ``lock``):

* bare: sglang's functions, no hook;
* pass-through: an AROUND hook that only calls through (the baseline);
* recorder: the recorder's hooks, writing to a real ``WriterThread``.

Cases (32 waiting, 12 running unless said):

* idle pass: empty waiting queue, no chunked request;
* latched, folded: the running batch is full, so sglang returns at once
  (its ``batch_is_full`` early return); the inputs repeat, so the recorder
  folds every pass into one record;
* latched, written: the same, but free KV changes every pass, so every pass
  is a record the writer thread builds and writes;
* admitting: the full admission path (prefix match, ``add_one_req`` per
  candidate, a truncated chunk, queue update, prefill stats) admits 6
  requests (the sixth as that chunk), on ``schedtrace.replay.state``'s stand-ins for
  the KV allocator, the prefix cache and the request-slot pool.
  ``ScheduleBatch.init_new`` is swapped for a light object (it would build
  tensors), so nothing is allocated, the recorder's allocator hooks never
  fire, and the bare pass is cheaper than a live one, which makes the ratio
  stricter;
* admitting, real pools: the same pass as close to a live CPU server's as a
  bench can get. Real ``ReqToTokenPool``, a real (one layer, one head) CPU
  ``MHATokenToKVPool`` of the server's ``max_total_tokens``, the real
  ``TokenToKVPoolAllocator`` over it and the prefix cache sglang builds for a
  plain model, a ``UnifiedRadixCache`` (the policy uses it too). The tree
  holds three system prompts and a few finished requests; the running
  requests hold their rows and KV and pin the first prompt, and every other
  waiting request starts with one of the prompts: the pass admits 8 (the
  eighth as a truncated chunk), 4 of them on a cached prompt, so admission
  locks non-root nodes, two already pinned and two not. The real
  ``init_new`` and ``prepare_for_extend`` run: request rows and KV are
  allocated (the recorder writes an ``Alloc`` record per pass), the
  req_to_token rows written, the sampling info built. Still not live: the
  model config is a light object (``BenchModelConfig``: the two fields read;
  a real ``ModelConfig`` needs a HF model directory), the scheduler object
  is the stand-in above (grammar manager, TP worker, load inquirer), and no
  forward follows.

Both admitting cases rebuild their state before every timed call, outside the
timed region and with no hook installed, and empty the young GC generation,
so every call does the same work; the arms take turns and each reports its
median. The real-pools case is the loaded pass the recorder's "+5% at most"
target is about; the stand-in case has the same recorder work over a pass
that builds no batch.

Prints ns per pass, the recorder's extra ns over the pass-through baseline
(the admitting cases: median of per-round paired differences), the ratio
1 + extra / pass-through, trace bytes per written pass, and the ``Alloc``
records the trace holds (all from the real-pools case). Run:
``python -m bench.bench_recorder``. Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any, TypeVar

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from schedtrace.replay.sglang_env import ensure_sglang_importable  # noqa: E402

ensure_sglang_importable()

import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

from schedtrace.replay.driver import PassDriver  # noqa: E402
from schedtrace.replay.state import RecordedAllocator  # noqa: E402
from schedtrace.tracer.contract.format import TraceReader  # noqa: E402
from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS  # noqa: E402
from schedtrace.tracer.recorder.recorder import (  # noqa: E402
    ADDER,
    ALLOC_MODULE,
    ALLOCATOR_METHODS,
    BUDGET_CLASSES,
    BUDGET_MODULE,
    SCHED,
    Recorder,
    make_hooks,
)
from schedtrace.tracer.contract.schema import (  # noqa: E402
    Alloc,
    Header,
    KvSnapshot,
    Pass,
    RunningReq,
    ServerArgs,
    WaitingReq,
)
from schedtrace.tracer.recorder.writer_thread import WriterThread  # noqa: E402

WAITING, RUNNING = 32, 12
ADMITTING_CALLS = 300  # timed calls per arm in each admitting case
T = TypeVar("T")


def _resolve(target: str) -> tuple[object, str, str]:
    """(class, method name, target) for a dotted ``module.Class.method`` hook target."""
    owner_path, name = target.rsplit(".", 1)
    module, cls = owner_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls), name, target


# Every hook point a pass runs through: the pass, the adder and budget methods,
# the allocator methods (on real pools) and the tree caches' lock (the lock probe).
PASS_TARGETS = [
    f"{SCHED}._get_new_batch_prefill_raw",
    f"{ADDER}.add_one_req",
    f"{ADDER}.add_chunked_req",
    *[f"{BUDGET_MODULE}.{cls}.available_chunk_tokens" for cls in BUDGET_CLASSES],
    *[f"{ALLOC_MODULE}.{class_path}.{method}" for class_path, method in ALLOCATOR_METHODS],
    *LOCK_TARGETS,
]
# (owner, attribute, dotted hook target) of each of them.
PASS_POINTS: list[tuple[object, str, str]] = [_resolve(target) for target in PASS_TARGETS]


def pass_through(fn, *args, **kwargs):
    return fn(*args, **kwargs)


ORIGINALS = [(owner, name, owner.__dict__[name]) for owner, name, _ in PASS_POINTS if name in owner.__dict__]


def wrapped_for(hooks: dict[str, Callable] | None) -> list[tuple[object, str, Callable]]:
    """Every pass hook point wrapped as HookRegistry would (None: bare)."""
    targets = {(owner, name): target for owner, name, target in PASS_POINTS}
    if hooks is None:
        return ORIGINALS
    return [
        (owner, name, _wrap_fn(fn, pass_through if hooks is PASS_THROUGH else hooks[targets[owner, name]],
                               HookType.AROUND))
        for owner, name, fn in ORIGINALS
    ]


def install(points: list[tuple[object, str, Callable]]) -> None:
    for owner, name, fn in points:
        setattr(owner, name, fn)


@contextlib.contextmanager
def hooked(points: list[tuple[object, str, Callable]]) -> Iterator[None]:
    install(points)
    try:
        yield
    finally:
        install(ORIGINALS)


PASS_THROUGH: dict[str, Callable] = {}

Arms = tuple[tuple[str, list[tuple[object, str, Callable]]], ...]


class _LightBatch:
    """What the pass touches on the batch ``ScheduleBatch.init_new`` returns."""

    def __init__(self, reqs) -> None:
        self.reqs = reqs

    def prepare_for_extend(self) -> None:
        pass


def _light_init_new(cls, reqs, *args, **kwargs):
    return _LightBatch(reqs)


@contextlib.contextmanager
def light_init_new() -> Iterator[None]:
    original = ScheduleBatch.__dict__["init_new"]
    ScheduleBatch.init_new = classmethod(_light_init_new)
    try:
        yield
    finally:
        ScheduleBatch.init_new = original


class _VaryingAllocator(RecordedAllocator):
    """Free KV drops by one token each time it is read: no two passes fold."""

    def available_size(self) -> int:
        self.available -= 1
        return self.available


def server_args() -> ServerArgs:
    return ServerArgs("fcfs", 8192, 16384, 1, 48, 400_000, "torch_native", "bench")


def header() -> Header:
    return Header(1, "?", "?", "bench", 0, 0, None, 0, server_args(), max_req_slots=64)


def loaded_pass(batch_full: bool) -> Pass:
    waiting = [WaitingReq(f"w-{i:03d}", 1500 + 37 * i, 0, 256, 0, None, True) for i in range(WAITING)]
    running = [RunningReq(f"r-{i:03d}", 2000 + 11 * i, 1 + 5 * i, 256, True) for i in range(RUNNING)]
    return Pass(0, 0, 0, 1, 0, waiting, running, None, batch_full, KvSnapshot(300_000, 512), 40, 0.7, 8192,
                [], [], None, None, batch_full)


def prepare_scheduler(driver: PassDriver) -> None:
    """Attributes the admitting path reads after ``init_new``."""
    s = driver.scheduler
    s.hisparse_coordinator = None
    s.enable_hierarchical_cache = False
    s.enable_unified_cache_external_linker = False
    s.enable_priority_scheduling = False
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)


def set_pass_inputs(s: Scheduler, waiting: list[Req], chunked: Req | None, record: Pass) -> None:
    """The scheduler state a pass reads besides the pools."""
    s.waiting_queue = waiting
    s.chunked_req = chunked
    s.chunked_prefill_size = record.chunked_prefill_size
    s.new_token_ratio_tracker = SimpleNamespace(current=record.new_token_ratio)


def load(driver: PassDriver, record: Pass):
    waiting, batch, chunked = driver._load(record)
    s = driver.scheduler
    set_pass_inputs(s, waiting, chunked, record)
    return s, batch


def loop_ns(s, batch, n: int, repeats: int = 5) -> float:
    """Best of ``repeats`` of the mean ns per call over ``n`` calls."""
    fn = Scheduler._get_new_batch_prefill_raw
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn(s, None, batch)
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def interleaved_medians(
    arms: Arms, prepare: Callable[[], tuple[Any, Any]], n: int, after_recorder: Callable[[], None]
) -> tuple[dict[str, float], list]:
    """Median ns per arm of one pass on fresh state; the arms take turns.

    ``prepare`` returns (scheduler, running batch) for one call; it runs with
    no hook installed, so its own allocations reach no hook and are not
    timed. ``after_recorder`` runs after each recorder call (the writer's
    drain), also untimed. Returns the medians, plus ``"extra"``: the median of
    the per-round differences recorder minus pass-through (pairing the calls
    of one round cancels the machine's drift between rounds), and the first
    pass's admitted list.
    """
    samples: dict[str, list[int]] = {name: [] for name, _ in arms}
    admitted: list = []
    try:
        for i in range(n):
            turn = i % len(arms)
            for name, points in arms[turn:] + arms[:turn]:
                install(ORIGINALS)
                s, batch = prepare()
                gc.collect(0)  # every call starts with an empty young generation
                install(points)
                fn = Scheduler._get_new_batch_prefill_raw
                start = time.perf_counter_ns()
                new_batch, _ = fn(s, None, batch)
                samples[name].append(time.perf_counter_ns() - start)
                install(ORIGINALS)
                if name == "recorder":
                    after_recorder()
                if i == 0 and not admitted:
                    admitted = list(new_batch.reqs)
    finally:
        install(ORIGINALS)
    medians = {name: statistics.median(v) for name, v in samples.items()}
    medians["extra"] = statistics.median(r - p for r, p in zip(samples["recorder"], samples["pass-through"]))
    return medians, admitted


# --- admitting on real pools ---------------------------------------------------

CONTEXT_LEN = 8192  # req_to_token row width: above every bench request's length
# The pass only moves KV indices, never KV data: the smallest real pool will do.
KV_LAYERS, KV_HEADS, KV_HEAD_DIM = 1, 1, 8
SYSTEM_PROMPT_LENS = (1024, 512, 768)  # cached prefixes shared by waiting (and running) requests
FINISHED_IN_CACHE, FINISHED_LEN = 8, 2000  # finished requests' KV left in the tree: evictable
VOCAB = 32000


@dataclass(frozen=True)
class BenchModelConfig:
    """The ``ModelConfig`` fields the admitting pass reads (``init_new``,
    ``prepare_for_extend``, ``SamplingBatchInfo``) for a text-only model
    without mamba layers. A real ``ModelConfig`` loads a HF model directory."""

    vocab_size: int = VOCAB
    is_encoder_decoder: bool = False


def _tokens(first: int, n: int) -> array:
    """``n`` tokens of id ``first``: each sequence gets an id of its own, so
    prefixes are shared only where a system prompt is put in front."""
    return array("q", [first]) * n


def _req(rid: str, tokens: array, max_new: int, order: int) -> Req:
    req = Req(rid, "", tokens, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
    req.time_stats.wait_queue_entry_time = float(order)  # FCFS order
    return req


class RealPools:
    """Real request-slot pool, KV pool and allocator, and a radix tree over
    them, put back into one state before each pass (``reset``)."""

    def __init__(self, args: ServerArgs, slots: int) -> None:
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

    def scheduler_attributes(self, s: Scheduler) -> dict[str, Any]:
        """What the real pass reads on the scheduler beyond the stand-in setup."""
        return {
            "tree_cache": self.tree_cache,
            "token_to_kv_pool_allocator": self.allocator,
            "req_to_token_pool": self.req_to_token_pool,
            "policy": self.policy,
            # sglang's own; PassDriver's wraps each adder's chunk budget to read it back.
            "get_prefill_adder_class": MethodType(Scheduler.get_prefill_adder_class, s),
            "model_config": BenchModelConfig(),
            "enable_overlap": False,
            "spec_algorithm": SpeculativeAlgorithm.NONE,
        }

    def _cache(self, tokens: array) -> Any:
        """Insert ``tokens`` into the tree on fresh KV, as a finished prefill
        leaves them (KV of an already cached prefix is given back); returns the last node."""
        kv = self.allocator.alloc(len(tokens))
        result = self.tree_cache.insert(InsertParams(key=RadixKey(tokens), value=kv))
        self.allocator.free(kv[: result.prefix_len])
        return result.last_device_node

    def _running(self) -> list[Req]:
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

    def _waiting(self) -> list[Req]:
        """Every other waiting request starts with a system prompt."""
        waiting = []
        for n, w in enumerate(self.record.waiting):
            prefix = self.prompts[(n // 2) % len(self.prompts)] if n % 2 == 0 else array("q")
            tokens = prefix + _tokens(10_000 + n, w.input_len - len(prefix))
            waiting.append(_req(w.rid, tokens, w.max_new_tokens, n))
        return waiting

    def reset(self, s: Scheduler) -> ScheduleBatch:
        """Empty pools and tree, then the bench state; returns the running batch."""
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


# --- the run ---------------------------------------------------------------------


class TraceStats:
    """Drains the recorder's writer outside the timed regions and measures
    what one written pass costs it (bytes, and writer-thread ns)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.bytes_per_pass: dict[str, float] = {}
        self.writer_ns: dict[str, float] = {}
        self._drain_ns = 0

    def drain(self) -> None:
        start = time.perf_counter_ns()
        self.rec.writer.drain()
        self._drain_ns += time.perf_counter_ns() - start

    def written(self, case: str, run: Callable[[], T]) -> T:
        """``run()``, noting the bytes and writer time per pass it wrote."""
        rec, writer = self.rec, self.rec.writer
        rec._flush_held()
        writer.drain()
        size, seq = writer._writer.size, writer.next_pass_seq
        self._drain_ns = 0
        result = run()
        rec._flush_held()
        self.drain()
        passes = max(writer.next_pass_seq - seq, 1)
        self.bytes_per_pass[case] = (writer._writer.size - size) / passes
        self.writer_ns[case] = self._drain_ns / passes
        return result


def main() -> None:
    out = tempfile.mkdtemp(prefix="schedtrace-bench-")
    # The writer drains only when told to, outside the timed regions, and its
    # own time per written pass (build + encode + write) is reported apart.
    rec = Recorder(out)
    rec.writer = WriterThread(out, "bench", lambda p, f: header(), clock_ns=rec.now, flush_interval_s=3600)
    trace = TraceStats(rec)
    recorder_hooks = dict(make_hooks(rec))
    arms: Arms = tuple((name, wrapped_for(hooks)) for name, hooks in
                       (("bare", None), ("pass-through", PASS_THROUGH), ("recorder", recorder_hooks)))
    driver = PassDriver(header())
    prepare_scheduler(driver)
    rows: list[tuple[str, dict[str, float]]] = []

    with driver._config.installed():
        # idle
        s, batch = load(driver, Pass(0, 0, 0, 1, 0, [], [], None, False, KvSnapshot(1000, 0), 40, 0.7, 8192,
                                     [], [], None, None, False))
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                times[name] = loop_ns(s, batch, 200_000)
        rows.append(("idle pass", times))

        # latched, folded and written
        s, batch = load(driver, loaded_pass(batch_full=True))
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                times[name] = loop_ns(s, batch, 20_000)
        rows.append(("latched, folded", times))

        varying = _VaryingAllocator(400_000, 1)
        varying.available = 10**9
        s.token_to_kv_pool_allocator = varying
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                if name == "recorder":
                    times[name] = trace.written("latched, written", lambda: loop_ns(s, batch, 5_000))
                else:
                    times[name] = loop_ns(s, batch, 5_000)
        s.token_to_kv_pool_allocator = driver.allocator
        rows.append(("latched, written", times))

        # admitting (stand-ins): fresh state per call, arms interleaved, median per arm
        record = loaded_pass(batch_full=False)
        with light_init_new():
            times, stubbed_admitted = trace.written("admitting", lambda: interleaved_medians(
                arms, lambda: load(driver, record), ADMITTING_CALLS, trace.drain))
        rows.append(("admitting", times))

        # admitting on real pools, the same way
        pools = RealPools(server_args(), header().max_req_slots)
        s = driver.scheduler
        with attributes(s, pools.scheduler_attributes(s)):
            times, real_admitted = trace.written("admitting, real pools", lambda: interleaved_medians(
                arms, lambda: (s, pools.reset(s)), ADMITTING_CALLS, trace.drain))
        rows.append(("admitting, real pools", times))
    rec.close()

    hits = sum(1 for r in real_admitted if r.prefix_len > 0)
    print(f"{WAITING} waiting, {RUNNING} running; admitting pass admits {len(stubbed_admitted)} requests; "
          f"on real pools {len(real_admitted)} ({hits} on a cached prefix)")
    print(f"{'case':22} {'bare ns':>10} {'pass-thru ns':>13} {'recorder ns':>12} {'extra ns':>9} {'ratio':>7}")
    for name, t in rows:
        base, recd = t["pass-through"], t["recorder"]
        extra = t.get("extra", recd - base)
        print(f"{name:22} {t['bare']:10.0f} {base:13.0f} {recd:12.0f} {extra:9.0f} {1 + extra / base:7.3f}")
    for case, size in trace.bytes_per_pass.items():
        print(f"written pass, {case}: {size:.0f} trace bytes; writer thread {trace.writer_ns[case]:.0f} ns "
              f"(build + encode + write, off the scheduler thread)")
    print_trace_summary(rec.writer.paths)


def print_trace_summary(paths: list) -> None:
    allocs: list[Alloc] = []
    for path in paths:
        with TraceReader(path) as reader:
            allocs += [r for _, r in reader.records() if isinstance(r, Alloc)]
    with TraceReader(paths[0]) as reader:
        counts = reader.footer.counts
        print(f"trace file: {reader.file_size} bytes, {reader.pass_count} pass records, "
              f"idle_passes={counts.get('idle_passes')}, lost={counts.get('lost')}, "
              f"build_errors={counts.get('build_errors', 0)}")
    # Only the real-pools case allocates: the stand-in allocator is no hooked class.
    failed = sum(1 for a in allocs if not a.ok)
    print(f"alloc records (real pools only, {ADMITTING_CALLS} recorder passes): {len(allocs)}, failed {failed}, "
          f"ops {sorted({a.op for a in allocs})}, tokens asked per call {sorted({a.requested for a in allocs})}")


if __name__ == "__main__":
    main()
