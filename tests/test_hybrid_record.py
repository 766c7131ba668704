"""Recording hybrid pools, against real sglang pool objects built in-process.

The pools are sglang's own, on CPU at tiny sizes, built as sglang builds them
for the two hybrid families: a mamba model (``HybridReqToTokenPool`` with its
``MambaPool`` and ``MambaSlotAllocator``, a ``HybridLinearKVPool`` under a
``TokenToKVPoolAllocator``, a ``UnifiedRadixCache`` with FULL and MAMBA) and
a sliding-window model (``SWAKVPool`` under a ``SWATokenToKVPoolAllocator``,
a ``UnifiedRadixCache`` with FULL and SWA). ``HybridRig`` runs the real
``Scheduler._get_new_batch_prefill_raw`` on them (batch building and
allocation included) under the recorder's hooks, as HookRegistry installs
them, and between passes does what the scheduler does to a chunked request
and to a finished one.
"""

from __future__ import annotations

from array import array
from pathlib import Path
from types import MethodType, SimpleNamespace

import msgspec
import pytest

from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV

# sglang reads SGLANG_USE_CPU_ENGINE once, when it is first imported (its platform, ``is_cpu``): set it
# for that import only, so that no later test's child process inherits it.
with pytest.MonkeyPatch.context() as cpu_engine:
    cpu_engine.setenv(SGLANG_CPU_ENGINE_ENV, "1")
    from schedtrace.replay.driver import PassDriver  # noqa: E402  (makes sglang importable first)
from schedtrace.testing import builders# noqa: E402
from schedtrace.tracer.contract.format import TraceReader  # noqa: E402
from schedtrace.tracer.contract.schema import Alloc, Header, KvSnapshot, Pass, PoolLayout  # noqa: E402
from schedtrace.tracer.recorder import pools
from schedtrace.testing import rig# noqa: E402
from schedtrace.tracer.recorder.header import header_row  # noqa: E402
from schedtrace.tracer.recorder.hooks import make_hooks  # noqa: E402
from schedtrace.tracer.recorder.lifecycle import Recorder  # noqa: E402

def real_pools(family: str, *, kv_size: int = 4000, swa_size: int = 2000, window: int = 64,
               slots: int = 8, mamba_slots: int = 10):
    """(req_to_token_pool, allocator, tree_cache) as sglang builds them for ``family``, at these tests' sizes."""
    return rig.hybrid_pools(family, kv_size=kv_size, slots=slots, swa_size=swa_size, window=window,
                            mamba_slots=mamba_slots)


def replay_header(family: str, chunk: int = 1024) -> Header:
    """A header the replay driver builds its scheduler shell from (the recorder writes its own)."""
    layout = (PoolLayout("TokenToKVPoolAllocator", "UnifiedRadixCache", 4000, mamba_size=10, mamba_slots_per_req=1)
              if family == "mamba" else
              PoolLayout("SWATokenToKVPoolAllocator", "UnifiedRadixCache", 4000, swa_size=2000, sliding_window=64))
    return builders.header(
        is_hybrid_mamba=family == "mamba", is_hybrid_swa=family == "swa", pools=layout, max_req_slots=8,
        server_args=builders.server_args(max_total_tokens=4000, chunked_prefill_size=chunk, max_running_requests=8),
    )


class HybridRig:
    """The real scheduler pass on real hybrid pools, recorded by the recorder's real hooks.

    The scheduler object is the replay driver's shell (``Scheduler.__new__``
    with the attributes the pass reads) with the real pools, tree, policy and
    adder class put in; ``init_new`` and ``prepare_for_extend`` run for real,
    so request rows, mamba slots and KV are allocated.
    """

    def __init__(self, family: str, out: Path, *, chunk: int = 1024, **sizes: int) -> None:
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.family, self.out = family, out
        header = replay_header(family, chunk)
        self.driver = PassDriver(header)
        rig.prepare_scheduler(self.driver)
        s = self.scheduler = self.driver.scheduler
        with self.driver._config.installed():
            self.req_pool, self.allocator, self.tree = real_pools(family, **sizes)
        policy = SchedulePolicy("fcfs", self.tree, enable_hierarchical_cache=False,
                                enable_priority_scheduling=False, schedule_low_priority_values_first=False)
        server_args = SimpleNamespace(**msgspec.structs.asdict(header.server_args), mamba_radix_cache_strategy="no_buffer")
        for name, value in dict(
            tree_cache=self.tree, token_to_kv_pool_allocator=self.allocator, req_to_token_pool=self.req_pool,
            policy=policy, get_prefill_adder_class=MethodType(Scheduler.get_prefill_adder_class, s),
            model_config=rig.LightModelConfig(), enable_overlap=False, spec_algorithm=SpeculativeAlgorithm.NONE,
            is_hybrid_swa=family == "swa", server_args=server_args, chunked_prefill_size=chunk,
            new_token_ratio_tracker=SimpleNamespace(current=0.7), chunked_req=None, waiting_queue=[],
        ).items():
            setattr(s, name, value)
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)

    def queue(self, rid: str, tokens: array, max_new: int = 20) -> None:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        req = Req(rid, "", tokens, SamplingParams(max_new_tokens=max_new, ignore_eos=True))
        req.time_stats.wait_queue_entry_time = float(len(self.scheduler.waiting_queue))
        self.scheduler.waiting_queue.append(req)

    def record(self, passes: int, *, finish_at: dict[int, int] | None = None) -> Path:
        """Run ``passes`` passes under the recorder; ``finish_at`` {pass: n}: before that
        pass, the n oldest running requests finish (their KV goes to the tree). The trace."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        s, finish_at = self.scheduler, finish_at or {}
        rec = Recorder(self.out)
        rec.attach(s)
        points = rig.HookPoints()
        with self.driver._config.installed(), points.hooked(points.wrapped(dict(make_hooks(rec)))):
            for n in range(passes):
                for req in self.running.reqs[: finish_at.get(n, 0)]:
                    req.output_ids = [1]
                    req.finished_reason = FINISH_LENGTH(length=1)
                    release_kv_cache(req, self.tree, checkpoint=True)
                if finish_at.get(n):
                    self.running.filter_batch(keep_indices=list(range(finish_at[n], len(self.running.reqs))))
                try:
                    batch, self.running = s._get_new_batch_prefill_raw(None, self.running)
                except (AssertionError, RuntimeError):  # an allocation failed: recorded as the pass's error
                    batch = None
                self._after_pass(batch, checkpoint_kv_cache)
        rec.close()
        (path,) = rec.writer.paths
        return Path(path)

    def _after_pass(self, batch, checkpoint_kv_cache) -> None:
        """What ``get_next_batch_to_run`` does next: stash the chunk, merge the finished prefills."""
        s = self.scheduler
        chunked = s.chunked_req
        if chunked is not None and chunked.extend_end > chunked.prefix_len:
            checkpoint_kv_cache(chunked, self.tree)
        if batch is None:
            return
        batch.filter_batch(reqs_to_exclude=[chunked] if chunked is not None else [])
        if batch.is_empty():
            return
        if self.running.is_empty():
            self.running = batch
        else:
            self.running.merge_batch(batch)

    def counts(self) -> KvSnapshot:
        return pools.kv_row(pools.PoolReaders(self.scheduler).counts())


def prompt(token: int, n: int) -> array:
    return array("q", [token]) * n


def read(path: Path) -> tuple[Header, list]:
    with TraceReader(path) as reader:
        return reader.header, [r for _, r in reader.records()]


@pytest.fixture
def mamba_rig(tmp_path: Path) -> HybridRig:
    return HybridRig("mamba", tmp_path)


@pytest.fixture
def swa_rig(tmp_path: Path) -> HybridRig:
    return HybridRig("swa", tmp_path)


# --- per-pool counts at pass entry ------------------------------------------------


def _insert(rig_: HybridRig, token: int, n: int, *, lock: bool = False) -> None:
    """A finished request's KV (and, on mamba, its state) in the tree; ``lock``: still pinned."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    kv = rig_.allocator.alloc(n)
    state = rig_.req_pool.mamba_allocator.alloc(1) if rig_.family == "mamba" else None
    result = rig_.tree.insert(InsertParams(key=RadixKey(prompt(token, n)), value=kv, mamba_value=state))
    if lock:
        rig_.tree.lock(result.last_device_node)


def test_kv_counts_read_every_pool_of_a_real_mamba_scheduler(mamba_rig: HybridRig) -> None:
    _insert(mamba_rig, 7, 200)  # evictable: 200 KV tokens and one mamba state
    _insert(mamba_rig, 9, 100, lock=True)  # protected: 100 tokens and one state
    assert mamba_rig.counts() == KvSnapshot(
        available=4000 - 300, evictable=200, mamba_available=10 - 2, mamba_evictable=1,
        protected=100, mamba_protected=1,
    )
    # The tree's counts are read from its core, which its own count methods call.
    assert pools.PoolReaders(mamba_rig.scheduler).evictable.__self__ is mamba_rig.tree.tree_core


def test_kv_counts_read_both_sides_of_a_real_swa_allocator(swa_rig: HybridRig) -> None:
    _insert(swa_rig, 7, 200)
    _insert(swa_rig, 9, 100, lock=True)  # the lock pins the last 64-token window on the SWA side
    assert swa_rig.counts() == KvSnapshot(
        available=4000 - 300, evictable=200, swa_available=2000 - 300, swa_evictable=300 - 64,
        protected=100, swa_protected=64,
    )


def test_a_full_pool_scheduler_still_pays_for_two_counts_only(tmp_path: Path) -> None:
    rig_ = rig.RealPools(rig.server_args(), 8)
    s = SimpleNamespace(token_to_kv_pool_allocator=rig_.allocator, tree_cache=rig_.tree_cache,
                        req_to_token_pool=rig_.req_to_token_pool, is_hybrid_swa=False)
    assert pools.PoolReaders(s).counts() == (rig.server_args().max_total_tokens, 0)


# --- the header ---------------------------------------------------------------------


def test_header_records_the_real_pool_layout(mamba_rig: HybridRig, swa_rig: HybridRig) -> None:
    mamba = header_row(mamba_rig.scheduler, 1, 0, 0, 0)
    assert mamba.is_hybrid_mamba and not mamba.is_hybrid_swa and not mamba.exact_chunk_fill
    assert mamba.pools == PoolLayout(
        allocator="TokenToKVPoolAllocator", tree_cache="UnifiedRadixCache", full_size=4000,
        mamba_size=10, mamba_slots_per_req=1, mamba_strategy="no_buffer",
    )
    swa = header_row(swa_rig.scheduler, 1, 0, 0, 0)
    assert swa.is_hybrid_swa and not swa.is_hybrid_mamba
    assert swa.pools == PoolLayout(
        allocator="SWATokenToKVPoolAllocator", tree_cache="UnifiedRadixCache", full_size=4000,
        swa_size=2000, sliding_window=64,
    )


# --- the lock probe on the unified tree -----------------------------------------------


@pytest.mark.parametrize("core", ["rust", "python"])
@pytest.mark.parametrize("family", ["mamba", "swa"])
def test_the_lock_probe_keeps_what_a_unified_tree_pin_took_from_the_evictable_count(
        family, core, tmp_path: Path, monkeypatch) -> None:
    """The probe's drop (``IncLockRefResult.delta``) against the evictable count replay
    budgets with, read around a real pin, on either tree core sglang can build."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from schedtrace.tracer.recorder.lock_probe import LockProbe

    monkeypatch.setenv("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", core)
    rig_ = HybridRig(family, tmp_path)
    assert ("Rust" in type(rig_.tree.tree_core).__name__) == (core == "rust")
    _insert(rig_, 100, 200, lock=True)  # a running request pins the shared 200 tokens
    _insert(rig_, 100, 300)
    evictable = pools.PoolReaders(rig_.scheduler).evictable
    node = rig_.tree.match_prefix(MatchPrefixParams(key=RadixKey(prompt(100, 300)))).last_device_node
    probe, original = LockProbe(), UnifiedRadixCache.inc_lock_ref
    drops = []
    for _ in range(2):  # the first pin, then one on the now pinned prefix
        before = evictable()
        probe.armed = True
        probe.hook(original, rig_.tree, node)
        drops.append((probe.drop, before - evictable()))
    assert drops == [(100, 100), (0, 0)] and probe.error is None


def test_an_swa_pin_records_what_it_took_from_both_evictable_counts(swa_rig: HybridRig) -> None:
    """A candidate whose cached prefix a running request half pins: the full pin takes the
    unpinned 30 tokens, and the SWA pin (the trailing 64-token window) only those 30 too,
    where a trace without ``locked_swa_evictable`` leaves replay to assume the whole window.
    Replayed, the pass matches."""
    from schedtrace.replay.engine import replay_trace

    _insert(swa_rig, 100, 300, lock=True)  # running: pins [0, 300), and on the SWA side [236, 300)
    _insert(swa_rig, 100, 330)  # cached, unpinned: [300, 330)
    swa_rig.queue("w0", prompt(100, 330) + prompt(7, 50))
    path = swa_rig.record(1)
    _, records = read(path)
    (p,) = [r for r in records if isinstance(r, Pass)]
    (c,) = p.candidates
    assert (c.rid, c.prefix_len, c.locked_evictable, c.locked_swa_evictable) == ("w0", 330, 30, 30)
    fid = replay_trace(path, "stock", "stock").fidelity
    assert fid.matched == fid.total == 1


# --- real passes under the recorder ---------------------------------------------------


def test_real_mamba_passes_record_every_pool_and_each_state_slot(mamba_rig: HybridRig) -> None:
    for k in range(4):
        mamba_rig.queue(f"w{k}", prompt(100 + k, 600 + 100 * k))
    header, records = read(mamba_rig.record(3))
    assert header.pools.mamba_size == 10 and header.is_hybrid_mamba
    passes = [r for r in records if isinstance(r, Pass)]
    assert [[(a.rid, a.extend_len) for a in p.admitted] for p in passes] == [
        [("w0", 600), ("w1", 424)], [("w1", 276), ("w2", 748)], [("w2", 52), ("w3", 900)],
    ]
    # A new request takes one state slot when its row is bound; a continuing chunk keeps
    # its own, and stashing a chunk checkpoints its state into the tree (one slot more, pinned).
    assert [p.kv.mamba_available for p in passes] == [10, 7, 5]
    assert [p.kv.mamba_protected for p in passes] == [0, 1, 2]
    mamba_allocs = [a for a in records if isinstance(a, Alloc) and a.op == "mamba_alloc"]
    assert [(a.pass_seq, a.requested, a.available, a.ok) for a in mamba_allocs] == [
        (0, 2, 10, True),  # pass 0's slots, one record: w0 and w1 bind their rows
        (0, 1, 8, True),  # the stash after pass 0 (outside a pass: it follows pass 0's record)
        (1, 1, 7, True), (1, 1, 6, True),  # pass 1: w2; the stash
        (2, 1, 5, True),  # pass 2: w3
    ]


def test_a_mamba_slot_shortage_is_recorded_as_a_failed_slot_allocation(tmp_path: Path) -> None:
    rig_ = HybridRig("mamba", tmp_path, mamba_slots=1)  # KV for three, a state slot for one
    for k in range(3):
        rig_.queue(f"w{k}", prompt(100 + k, 200))
    _, records = read(rig_.record(1))
    (p,) = [r for r in records if isinstance(r, Pass)]
    assert [a.rid for a in p.admitted] == ["w0", "w1", "w2"]  # the adder does not count state slots here
    assert p.error is not None and p.error.startswith("AssertionError: Not enough space for mamba cache")
    mamba_allocs = [(a.requested, a.available, a.ok, a.evictable) for a in records
                    if isinstance(a, Alloc) and a.op == "mamba_alloc"]
    # The batch asked for two slots with one free, and failed; evictable counts the tree's states.
    assert mamba_allocs == [(2, 1, False, p.kv.mamba_evictable)]


def test_state_slots_outside_a_pass_are_one_record_per_binding_and_per_call(mamba_rig: HybridRig) -> None:
    """With no pass running: binding three requests' rows is one ``mamba_alloc``, a lone
    slot (a checkpoint, a stash) one more; a refused lone slot records the tree's
    evictable state slots."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    _insert(mamba_rig, 7, 200)  # one evictable state in the tree
    reqs = [Req(f"r{k}", "", prompt(10 + k, 50), SamplingParams(max_new_tokens=4)) for k in range(3)]
    rec = Recorder(mamba_rig.out)
    rec.attach(mamba_rig.scheduler)
    slots = mamba_rig.req_pool.mamba_allocator
    points = rig.HookPoints()
    with mamba_rig.driver._config.installed(), points.hooked(points.wrapped(dict(make_hooks(rec)))):
        mamba_rig.req_pool.alloc(reqs)  # 10 slots: 1 in the tree, 3 now
        slots.alloc(1)
        assert slots.alloc(slots.available_size() + 1) is None
    rec.close()
    _, records = read(Path(rec.writer.paths[0]))
    allocs = [(a.requested, a.available, a.ok, a.evictable) for a in records if isinstance(a, Alloc)]
    assert allocs == [(3, 9, True, 0), (1, 6, True, 0), (6, 5, False, 1)]


def test_real_swa_passes_record_both_sides(swa_rig: HybridRig) -> None:
    for k in range(4):
        swa_rig.queue(f"w{k}", prompt(100 + k, 600 + 100 * k))
    _, records = read(swa_rig.record(3))
    passes = [r for r in records if isinstance(r, Pass)]
    # Stashing a chunk leaves only its last 64-token window on the SWA side (pinned).
    assert [(p.kv.available, p.kv.swa_available, p.kv.swa_evictable, p.kv.swa_protected) for p in passes] == [
        (4000, 2000, 0, 0), (2976, 1335, 1, 64), (1952, 994, 2, 128),
    ]
    assert [[(a.rid, a.extend_len) for a in p.admitted] for p in passes] == [
        [("w0", 600), ("w1", 424)], [("w1", 276), ("w2", 748)], [("w2", 52), ("w3", 900)],
    ]
    # SWAPrefillBudget caps the continuing chunk by the SWA side: 994 free + 2 evictable, less a page.
    assert [p.chunk.budget for p in passes[1:]] == [1024, 994 + 2 - 1]
    allocs = [(a.requested, a.available) for a in records if isinstance(a, Alloc)]
    assert allocs == [(1024, 2000), (1024, 1335), (952, 994)]  # available: the smaller side, as the allocator reports it
