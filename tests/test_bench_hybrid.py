"""The hybrid recorder bench runs on real sglang hybrid pools, and the recorder writes what it read there.

No timings: what ``bench/bench_hybrid.py`` builds (sglang's own pool classes,
one state put back before every pass) and what the recorder's hooks write of
one admitting pass on it (every pool's counts, its ``mamba_alloc`` records). Also that the recorder's cached count readers follow the pools when
another scheduler's are read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV  # the contract imports no sglang
os.environ.setdefault(SGLANG_CPU_ENGINE_ENV, "1")

from schedtrace.replay.driver import PassDriver  # noqa: E402  (makes sglang importable first)
from schedtrace.tracer.contract.format import TraceReader  # noqa: E402
from schedtrace.tracer.contract.schema import Alloc, KvSnapshot, Pass  # noqa: E402
from schedtrace.tracer.recorder import pools
from schedtrace.testing import rig# noqa: E402
from schedtrace.tracer.recorder.hooks import make_hooks  # noqa: E402
from schedtrace.tracer.recorder.lifecycle import Recorder  # noqa: E402

from bench.bench_hybrid import MAMBA_SLOTS, SWA_SIZE, HybridPools, hybrid_header  # noqa: E402


def bench_state(family: str):
    driver = PassDriver(hybrid_header(family))
    rig.prepare_scheduler(driver)
    hybrid = HybridPools(family, driver)
    hybrid.attach(driver.scheduler)
    return driver, hybrid, driver.scheduler


@pytest.fixture(scope="module")
def mamba():
    return bench_state("mamba")


@pytest.fixture(scope="module")
def swa():
    return bench_state("swa")


def test_the_bench_builds_sglangs_hybrid_pools(mamba, swa) -> None:
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    _, _, s = mamba
    assert isinstance(s.req_to_token_pool, HybridReqToTokenPool)
    assert isinstance(s.req_to_token_pool.mamba_allocator, MambaSlotAllocator)
    assert type(s.token_to_kv_pool_allocator) is TokenToKVPoolAllocator
    assert isinstance(s.token_to_kv_pool_allocator._kvcache, HybridLinearKVPool)
    assert isinstance(s.tree_cache, UnifiedRadixCache) and s.tree_cache.supports_mamba()
    assert set(s.tree_cache.tree_components) == {ComponentType.FULL, ComponentType.MAMBA}
    assert s.req_to_token_pool.mamba_allocator.size == MAMBA_SLOTS
    _, _, s = swa
    assert isinstance(s.token_to_kv_pool_allocator, SWATokenToKVPoolAllocator) and s.is_hybrid_swa
    assert isinstance(s.token_to_kv_pool_allocator._kvcache, SWAKVPool)
    assert set(s.tree_cache.tree_components) == {ComponentType.FULL, ComponentType.SWA}
    assert s.token_to_kv_pool_allocator.size_swa == SWA_SIZE


@pytest.mark.parametrize("family", ["mamba", "swa"])
def test_every_pass_starts_from_the_same_state_and_admits_on_cached_prompts(family, request) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    driver, hybrid, s = request.getfixturevalue(family)
    with driver._config.installed():
        entries, admitted = [], []
        for _ in range(2):
            batch = hybrid.reset(s)
            entries.append(pools.PoolReaders(s).counts())
            new_batch, _ = Scheduler._get_new_batch_prefill_raw(s, None, batch)
            admitted.append([(r.rid, r.prefix_len > 0) for r in new_batch.reqs])
    assert entries[0] == entries[1] and admitted[0] == admitted[1]
    assert len(admitted[0]) == 8 and sum(hit for _, hit in admitted[0]) == 4
    counts = KvSnapshot(*entries[0])
    # Cached prompts and running inputs are evictable or pinned on the hybrid side as well.
    if family == "mamba":
        assert counts.mamba_available < MAMBA_SLOTS and counts.mamba_evictable and counts.mamba_protected
    else:
        assert counts.swa_available < SWA_SIZE and counts.swa_evictable and counts.swa_protected


@pytest.mark.parametrize("family", ["mamba", "swa"])
def test_the_recorder_writes_the_hybrid_counts_it_read(family, request, tmp_path: Path) -> None:
    from sglang.srt.managers.scheduler import Scheduler

    driver, hybrid, s = request.getfixturevalue(family)
    rec = Recorder(tmp_path)
    rec.attach(s)
    points = rig.HookPoints()
    with driver._config.installed():
        batch = hybrid.reset(s)
        entry = KvSnapshot(*pools.PoolReaders(s).counts())
        with points.hooked(points.wrapped(dict(make_hooks(rec)))):
            Scheduler._get_new_batch_prefill_raw(s, None, batch)
    rec.close()
    (path,) = rec.writer.paths
    with TraceReader(path) as reader:
        header = reader.header
        records = [r for _, r in reader.records()]
    assert header.pools == pools.pool_layout(s) and header.pools.tree_cache == "UnifiedRadixCache"
    assert (header.is_hybrid_mamba, header.is_hybrid_swa) == (family == "mamba", family == "swa")
    (p,) = [r for r in records if isinstance(r, Pass)]
    assert p.kv == entry and len(p.admitted) == 8
    ops = [a.op for a in records if isinstance(a, Alloc)]
    # The pass's state slots are one record, at its first: the 4 on a cached prompt copy
    # their state into a slot of their own at the match, binding the 8 rows takes the other
    # 4; then the KV. ``available``: free before the first.
    assert ops == (["mamba_alloc", "alloc"] if family == "mamba" else ["alloc"])
    mamba = [(a.requested, a.available, a.ok) for a in records if isinstance(a, Alloc) and a.op == "mamba_alloc"]
    assert mamba == ([(8, entry.mamba_available, True)] if family == "mamba" else [])


def test_the_cached_count_readers_follow_the_pools_read(mamba, swa) -> None:
    """Reading one scheduler's pools, then another's, then the first again: each read is its own."""
    from sglang.srt.managers.scheduler import Scheduler

    reads = []
    for (driver, hybrid, s), admit in ((mamba, False), (swa, True), (mamba, False)):
        with driver._config.installed():
            batch = hybrid.reset(s)
            if admit:  # the pass pins cached prompts: the counts differ from the other scheduler's
                Scheduler._get_new_batch_prefill_raw(s, None, batch)
        tree, allocator = s.tree_cache, s.token_to_kv_pool_allocator
        full_available = getattr(allocator, "full_available_size", allocator.available_size)  # SWA: the full side
        reads.append((KvSnapshot(*pools.PoolReaders(s).counts()), pools.PoolReaders(s).evictable(),
                      full_available(), tree.full_evictable_size()))
    for counts, evictable, available, full_evictable in reads:
        assert counts.available == available and counts.evictable == full_evictable == evictable
    assert reads[0][0].mamba_available is not None and reads[1][0].swa_available is not None
    assert reads[1][0].mamba_available is None and reads[2][0] == reads[0][0]
    assert reads[1][0].evictable != reads[0][0].evictable
