"""Replaying hybrid (SWA, mamba) traces on sglang's own hybrid code paths.

Three sources of traces: the real scheduler pass run in-process on real
hybrid pools under the recorder (``HybridRig``, tests/test_hybrid_record.py),
hand-built passes whose recorded decisions are what the real code decided,
and the live hybrid sandboxes under overload (``mamba_sandbox``,
``swa_sandbox``). Replay runs sglang's ``SWAPrefillBudget``, the adder's
mamba paths and the scheduler's ``is_hybrid_swa`` branch on stand-ins that
report each pool's recorded counts.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest

from test_hybrid_record import HybridRig, prompt, read  # noqa: E402  (imports sglang for the rig)

from schedtrace.replay.loop.run import _check_totals, run_arms
from schedtrace.replay.driver import PassDriver
from schedtrace.replay.engine import replay_trace
from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.replay.loop.pools import LoopPools
from schedtrace.replay.loop.state import LoopReq, LoopState, apply_decision, to_pass
from schedtrace.testing import builders
from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import (
    Admitted, ChunkedReq, Header, KvSnapshot, Pass, PoolLayout, RunningReq, WaitingReq,
)
from schedtrace.tracer.sandbox.server import SandboxServer

SWA_LAYOUT = PoolLayout("SWATokenToKVPoolAllocator", "UnifiedRadixCache", 40000, swa_size=32000, sliding_window=128)
MAMBA_LAYOUT = PoolLayout("TokenToKVPoolAllocator", "UnifiedRadixCache", 40000, mamba_size=48,
                          mamba_slots_per_req=1, mamba_strategy="no_buffer")


def hybrid_header(family: str, **fields) -> Header:
    if family == "full":
        return builders.header(**fields)
    layout = SWA_LAYOUT if family == "swa" else MAMBA_LAYOUT
    return builders.header(is_hybrid_swa=family == "swa", is_hybrid_mamba=family == "mamba", pools=layout, **fields)


def kv(family: str, available: int, evictable: int = 0, *, other: int = 30000) -> KvSnapshot:
    """The full pool's counts, and the other pool's (SWA tokens or mamba slots) with room."""
    if family == "swa":
        return KvSnapshot(available, evictable, swa_available=other, swa_evictable=0)
    if family == "mamba":
        return KvSnapshot(available, evictable, mamba_available=24, mamba_evictable=0)
    return KvSnapshot(available, evictable)


def assert_faithful(trace: Path) -> None:
    report = replay_trace(trace, "stock", "fixed")
    fid = report.fidelity
    assert fid.total > 0 and fid.matched == fid.total, [(m.pass_, m.fields, m.recorded, m.replayed)
                                                         for m in fid.mismatches[:5]]


# --- real passes on real hybrid pools ------------------------------------------------


@pytest.mark.parametrize("family", ["mamba", "swa"])
def test_real_passes_on_real_hybrid_pools_replay_exactly(tmp_path: Path, family: str) -> None:
    """Chunked prefill, pool pressure, a finish into the tree, and a cached prefix:
    every recorded decision comes out of the replay on recorded counts alone."""
    rig_ = HybridRig(family, tmp_path)
    system = prompt(5, 300)
    for k in range(6):
        rig_.queue(f"w{k}", (system if k % 2 else prompt(100 + k, 0)) + prompt(100 + k, 400 + 150 * k))
    trace = rig_.record(8, finish_at={3: 1, 5: 2})
    _, records = read(trace)
    passes = [r for r in records if isinstance(r, Pass)]
    assert any(c.prefix_len for p in passes for c in p.candidates)  # a cached prefix was matched and pinned
    assert any(p.chunk is not None for p in passes) and any(p.kv.evictable for p in passes)
    assert_faithful(trace)


def test_a_mamba_trace_reports_how_each_fix_meets_its_pools(tmp_path: Path) -> None:
    rig_ = HybridRig("mamba", tmp_path)
    rig_.queue("w0", prompt(7, 1500))
    report = replay_trace(rig_.record(2), "stock", "fixed")
    notes = report.fix_notes
    assert list(notes) == list(FIX_NAMES)
    assert all(note.startswith("applies:") for note in notes.values())
    assert "base PrefillBudget" in notes["chunk-cap"]


def test_an_swa_trace_says_which_fixes_it_already_has_or_never_reaches(tmp_path: Path) -> None:
    rig_ = HybridRig("swa", tmp_path)
    rig_.queue("w0", prompt(7, 1500))
    notes = replay_trace(rig_.record(2), "stock", "fixed").fix_notes
    assert notes["chunk-cap"].startswith("not reached:") and "SWAPrefillBudget" in notes["chunk-cap"]
    assert notes["latch"].startswith("already present:")
    assert notes["one-chunk"].startswith("applies:") and notes["aiter"].startswith("applies:")


def test_a_full_pool_trace_has_no_fix_notes(tmp_path: Path) -> None:
    p = builders.pass_record(0, kv=KvSnapshot(30000, 0))
    report = replay_trace(write_trace(tmp_path / "full.trace", hybrid_header("full"), [p]), "stock", "fixed")
    assert report.fix_notes == {}


# --- the difference the hybrid paths make ---------------------------------------------


def chunk_cap_pass(family: str) -> Pass:
    """A continuing chunk with the full pool spent; the SWA side (or the mamba slots) has room."""
    return builders.pass_record(
        0,
        running=[RunningReq(f"run-{k}", 3000, 100, 300, True) for k in range(11)],
        chunked=ChunkedReq("long", 30000, 8192, 300, 0, True),
        kv=kv(family, 0),
        req_slots_free=1,
    )


@pytest.mark.parametrize("family", ["full", "mamba"])
def test_chunk_cap_diverges_where_the_base_budget_sizes_the_chunk(tmp_path: Path, family: str) -> None:
    trace = write_trace(tmp_path / f"{family}.trace", hybrid_header(family), [chunk_cap_pass(family)])
    (div,) = replay_trace(trace, "stock", "fixed").divergences
    assert div.kinds == ["admitted", "chunk", "over_ask"] and div.fixes == ["chunk-cap"]
    assert div.old.chunk_size == 8192 and div.old.over_ask == 8192  # stock asks for a chunk of nothing
    assert div.new.chunk_size is None and div.new.over_ask == 0  # the fix defers it


def test_on_swa_the_same_pass_has_no_chunk_cap_divergence(tmp_path: Path) -> None:
    """SWAPrefillBudget sizes the chunk itself and already defers it: stock and the
    fix agree, and the report says the fix is not reached."""
    trace = write_trace(tmp_path / "swa.trace", hybrid_header("swa"), [chunk_cap_pass("swa")])
    report = replay_trace(trace, "stock", "chunk-cap")
    assert report.divergences == []
    driver = PassDriver(hybrid_header("swa"))
    stock = driver.decide(chunk_cap_pass("swa"), "stock")
    assert stock.chunk_budget is None and stock.chunk_size is None and stock.over_ask == 0
    assert report.fix_notes["chunk-cap"].startswith("not reached:")


def test_the_swa_budget_defers_on_its_own_side_too(tmp_path: Path) -> None:
    """Full pool free, SWA side spent: the SWA budget still defers the chunk (and the full
    pool's budget would have run it); the SWA over-ask is what replay would have counted."""
    p = msgspec.structs.replace(chunk_cap_pass("swa"), kv=KvSnapshot(30000, 0, swa_available=0, swa_evictable=0))
    driver = PassDriver(hybrid_header("swa"))
    assert driver.decide(p, "stock").chunk_size is None
    full = PassDriver(hybrid_header("full")).decide(msgspec.structs.replace(p, kv=KvSnapshot(30000, 0)), "stock")
    assert full.chunk_size == 8192


def latch_pass(family: str) -> Pass:
    """batch_is_full latched over a running batch, every pool with room; the recorded
    outputs are stock's: under SWA it admits (sglang reset the latch), under mamba not."""
    swa = family == "swa"
    return builders.pass_record(
        0,
        running=[RunningReq(f"run-{k}", 3000, 100, 300, True) for k in range(3)],
        waiting=[WaitingReq("queued", 2000, 0, 300, 0, None, True)],
        batch_is_full_in=True,
        kv=kv(family, 30000),
        req_slots_free=10,
        admitted=[Admitted("queued", 0, 2000)] if swa else [],
        batch_is_full_out=not swa,
    )


def test_the_latch_stalls_a_mamba_pass_and_is_already_reset_on_swa(tmp_path: Path) -> None:
    mamba = replay_trace(write_trace(tmp_path / "m.trace", hybrid_header("mamba"), [latch_pass("mamba")]))
    (div,) = mamba.divergences
    assert div.old.admitted == [] and div.new.admitted == [("queued", 2000)] and "latch" in div.fixes
    swa = replay_trace(write_trace(tmp_path / "s.trace", hybrid_header("swa"), [latch_pass("swa")]))
    assert swa.divergences == []
    for report in (mamba, swa):
        assert report.fidelity.matched == report.fidelity.total == 1


@pytest.mark.parametrize("family", ["full", "swa", "mamba"])
def test_a_retracted_request_is_prefilled_again_with_its_outputs(family: str) -> None:
    """Found by the closed loop on SWA (decode retracts there): a queued request with
    outputs gets them as sglang keeps them (an ``array``), so its refill is real code too."""
    p = builders.pass_record(0, waiting=[WaitingReq("back", 100, 7, 50, 0, None, True)], kv=kv(family, 30000),
                             req_slots_free=4)
    decision = PassDriver(hybrid_header(family)).decide(p, "stock")
    assert decision.error is None and decision.admitted == [("back", 107)]


@pytest.mark.parametrize("family, exact, extend", [
    ("full", False, 992), ("full", True, 1000),  # billed by pages, or exactly (gfx95)
    ("mamba", True, 992),  # a mamba tree sharing prefixes keeps page-aligned cuts
])
def test_the_recorded_exact_chunk_fill_reaches_the_real_adder(family: str, exact: bool, extend: int) -> None:
    """1000 tokens against a 1000-token chunk on 16-token pages: 1008 by pages, so
    ``_select_prefill_admission`` cuts 992; billed exactly, the prompt fits whole."""
    header = hybrid_header(family, exact_chunk_fill=exact,
                           server_args=builders.server_args(page_size=16, chunked_prefill_size=1000))
    p = builders.pass_record(0, waiting=[WaitingReq("w", 1000, 0, 20, 0, None, True)], kv=kv(family, 30000),
                             req_slots_free=4, chunked_prefill_size=1000)
    assert PassDriver(header).decide(p, "stock").admitted == [("w", extend)]


# --- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("fields, message", [
    ({"is_hybrid_mamba": True}, "predates hybrid recording"),
    ({"is_hybrid_swa": True, "pools": msgspec.structs.replace(SWA_LAYOUT, allocator="UnifiedSWATokenToKVPoolAllocator")},
     "UnifiedSWATokenToKVPoolAllocator is not replayable"),
    ({"is_hybrid_mamba": True, "pools": msgspec.structs.replace(MAMBA_LAYOUT, mamba_slot_cost=24)},
     "slot cost 24 tokens"),
    ({"is_hybrid_mamba": True, "is_hybrid_swa": True, "pools": SWA_LAYOUT}, "SWA and mamba pools together"),
])
def test_pools_replay_cannot_rebuild_are_refused_naming_the_file(tmp_path: Path, fields, message) -> None:
    trace = write_trace(tmp_path / "unified.trace", builders.header(**fields), [builders.pass_record(0)])
    with pytest.raises(ReplayStateError, match=message) as caught:
        replay_trace(trace, "stock", "fixed")
    assert str(caught.value).startswith(str(trace)) and "\n" not in str(caught.value)


def test_a_pass_without_the_counts_of_its_pool_is_refused(tmp_path: Path) -> None:
    driver = PassDriver(hybrid_header("mamba"))
    with pytest.raises(ReplayStateError, match="mamba_available"):
        driver.decide(builders.pass_record(0, waiting=[WaitingReq("w", 10, 0, 5, 0)], kv=KvSnapshot(100, 0)), "stock")


# --- closed loop -------------------------------------------------------------------------

SWA_POOLS = LoopPools(swa_window=64, swa_eviction_interval=16)
MAMBA_POOLS = LoopPools(mamba_slots_per_req=3)


def loop_state(**fields) -> LoopState:
    base = dict(waiting=[], running=[], chunked=None, batch_is_full=False, free=1000, evictable=0, req_slots_free=4)
    return LoopState(**{**base, **fields})


def waiting(rid: str, input_len: int, prefix_len: int = 0) -> LoopReq:
    return LoopReq(rid=rid, input_len=input_len, max_new_tokens=50, target_output=3, prefix_len=prefix_len)


def step(s: LoopState, decision: Decision, pools: LoopPools, radix: bool = True, **options):
    after, result = apply_decision(s, decision, page_size=1, radix_cache=radix, pools=pools, **options)
    assert after.pool_totals() == s.pool_totals()  # the self-check: no pool makes or loses a unit
    return after, result


def test_swa_admission_pages_both_sides_and_decode_slides_the_window() -> None:
    s = loop_state(waiting=[waiting("a", 100)], swa_free=500, swa_evictable=0)
    s, _ = step(s, Decision(admitted=[("a", 100)]), SWA_POOLS)
    assert (s.free, s.swa_free) == (900, 400) and s.running[0].swa_held == 100
    s, _ = step(s, Decision(admitted=[]), SWA_POOLS)
    # 101 tokens: 37 left the 64-token window, more than the 16-token interval: freed.
    assert s.running[0].swa_held == 64 and s.swa_free == 436 and s.free == 899
    s, result = step(s, Decision(admitted=[]), SWA_POOLS)
    assert result.finished == ["a"] and s.swa_evictable == 65 and s.evictable == 102


def test_swa_admission_that_the_swa_side_cannot_page_admits_nothing() -> None:
    s = loop_state(waiting=[waiting("a", 100)], swa_free=50, swa_evictable=20)
    after, result = step(s, Decision(admitted=[("a", 100)]), SWA_POOLS)
    assert result.failed and result.kv_shortfall == 30 and after.waiting[0].rid == "a"


def test_mamba_admission_takes_the_state_slots_and_finish_caches_one() -> None:
    s = loop_state(waiting=[waiting("a", 100), waiting("b", 50)], mamba_free=4, mamba_evictable=3)
    s, result = step(s, Decision(admitted=[("a", 100), ("b", 50)]), MAMBA_POOLS)
    assert not result.failed and [r.mamba_held for r in s.running] == [3, 3]
    assert (s.mamba_free, s.mamba_evictable) == (0, 1)  # 6 slots: 4 free, 2 cached states evicted
    s, _ = step(s, Decision(admitted=[]), MAMBA_POOLS)
    s, result = step(s, Decision(admitted=[]), MAMBA_POOLS)
    assert sorted(result.finished) == ["a", "b"]
    assert (s.mamba_free, s.mamba_evictable) == (4, 3)  # each keeps its last state in the tree


def test_under_no_buffer_each_checkpoint_forks_the_state_and_unlocks_the_last_fork() -> None:
    """MambaComponent.prepare_for_caching_req: a prefill or chunk that lands forks the request's
    state into a slot for its new node, which it locks; the node of its last fork is unlocked."""
    forks = LoopPools(mamba_slots_per_req=1, mamba_forks=True)
    s = loop_state(waiting=[waiting("a", 100), waiting("c", 300)], mamba_free=6, mamba_evictable=0)
    s, _ = step(s, Decision(admitted=[("a", 100), ("c", 100)], new_chunked_rid="c"), forks)
    assert (s.mamba_free, s.mamba_evictable) == (2, 0)  # each: its state and its fork
    s, _ = step(s, Decision(admitted=[], chunk_size=100), forks)
    assert (s.mamba_free, s.mamba_evictable) == (1, 1)  # c's second fork; its first is evictable
    s, _ = step(s, Decision(admitted=[], chunk_size=100), forks)
    assert (s.mamba_free, s.mamba_evictable) == (0, 2) and s.chunked is None
    s, _ = step(s, Decision(admitted=[]), forks)
    s, result = step(s, Decision(admitted=[]), forks)
    assert sorted(result.finished) == ["a", "c"]
    assert (s.mamba_free, s.mamba_evictable) == (0, 6)  # each leaves its last state and its fork
    plain, _ = step(loop_state(waiting=[waiting("a", 100)], mamba_free=6, mamba_evictable=0),
                    Decision(admitted=[("a", 100)]), LoopPools(mamba_slots_per_req=1))
    assert (plain.mamba_free, plain.mamba_evictable) == (5, 0)  # another strategy: no fork


def test_a_retracted_request_keeps_its_forked_prefix_in_the_mamba_tree() -> None:
    """release_kv_cache unlocks what the tree holds: with the fork there, the prompt stays cached
    (evictable) and the request matches it when queued again, as on the full pool."""
    forks = LoopPools(mamba_slots_per_req=1, mamba_forks=True)
    s = loop_state(waiting=[waiting("a", 100), waiting("b", 100)], mamba_free=6, mamba_evictable=0, forward_ct=1)
    s, _ = step(s, Decision(admitted=[("a", 100), ("b", 100)]), forks)
    s, result = step(s, Decision(admitted=[]), forks, retract_every=1)
    (again,) = s.waiting
    assert result.retracted == [again.rid] and again.prefix_len == 100
    assert (s.mamba_free, s.mamba_evictable) == (3, 1) and s.evictable == 100


def test_a_mamba_slot_shortage_fails_the_pass() -> None:
    s = loop_state(waiting=[waiting("a", 100)], mamba_free=1, mamba_evictable=1)
    after, result = step(s, Decision(admitted=[("a", 100)]), MAMBA_POOLS)
    assert result.failed and result.mamba_shortfall == 1 and after.free == 1000


def test_to_pass_reports_every_pool_and_the_ring_from_free_slots() -> None:
    s = loop_state(swa_free=300, swa_evictable=7, req_slots_free=3)
    assert to_pass(s, seq=0, t_ns=0, new_token_ratio=0.5, chunked_prefill_size=None, pools=SWA_POOLS).kv == \
        KvSnapshot(1000, 0, swa_available=300, swa_evictable=7)
    ring = LoopPools(swa_ring_cost=256)
    assert to_pass(loop_state(req_slots_free=3), seq=0, t_ns=0, new_token_ratio=0.5, chunked_prefill_size=None,
                   pools=ring).kv == KvSnapshot(1000, 0, swa_available=3 * 256, swa_evictable=0)


def test_the_closed_loop_self_check_names_a_pool_that_lost_units() -> None:
    s = loop_state(waiting=[waiting("a", 100)], mamba_free=4, mamba_evictable=0)
    broken = s.copy()
    broken.mamba_free -= 1
    with pytest.raises(ReplayStateError, match="pass 7: the mamba pool holds 3 units, not 4"):
        _check_totals(s.pool_totals(), broken, 7)


@pytest.mark.parametrize("family", ["mamba", "swa"])
def test_closed_loop_on_a_real_hybrid_trace_evolves_every_pool(tmp_path: Path, family: str) -> None:
    rig_ = HybridRig(family, tmp_path)
    for k in range(5):
        rig_.queue(f"w{k}", prompt(100 + k, 500 + 200 * k))
    runs = run_arms(rig_.record(3), ["stock", "fixed"])
    for arm, run in runs.items():
        outcome = run.outcome
        assert outcome.completed == 5 and outcome.unfinished == 0 and outcome.exceptions == 0, arm
        other = [p.kv.swa_available if family == "swa" else p.kv.mamba_available for p in run.passes]
        assert None not in other and len(set(other)) > 1, arm  # the other pool is evolved, not copied


# --- live hybrid sandboxes -----------------------------------------------------------------


@pytest.mark.parametrize("model, family", [("hybrid-mamba", "mamba"), ("hybrid-swa", "swa")])
def test_stock_replays_a_live_hybrid_overload_trace_exactly(
    hybrid_sandboxes: dict[str, SandboxServer], model: str, family: str
) -> None:
    """16 prompts of 0.5k-2.5k tokens at once on the model's overload (1k chunks, a 16k pool):
    chunks, queueing and pool pressure; every pass of the shared server's trace so far replays
    exactly (its other tests' loads included)."""
    from conftest import generate
    from test_sandbox_hybrid import one_trace, traced

    server = hybrid_sandboxes[model]
    lens = [500 + (k * 389) % 2000 for k in range(16)]
    rids = [f"hybrid-replay-{family}-{k}" for k in range(len(lens))]
    with ThreadPoolExecutor(len(lens)) as pool:
        list(pool.map(lambda k: generate(server, rids[k], lens[k], 24), range(len(lens))))
    header, records = traced(server.trace_dir, set(rids))  # once every finish is written
    trace = one_trace(server.trace_dir)
    passes = [r for r in records if isinstance(r, Pass)]
    assert header.pools is not None and (header.is_hybrid_mamba if family == "mamba" else header.is_hybrid_swa)
    other = [p.kv.mamba_available if family == "mamba" else p.kv.swa_available for p in passes]
    assert passes and None not in other
    assert_faithful(trace)
    runs = run_arms(trace, ["stock", "fixed"])  # the pool self-check runs on every step
    assert all(run.outcome.exceptions == 0 and run.outcome.unfinished == 0 for run in runs.values())
