"""The stall rule agrees with sglang's own admission check on hybrid pools (issue 13).

The oracle is the real sglang pass under the fixed logic on the hybrid
stand-ins replay builds (``SWATokenToKVPoolAllocator`` with
``SWAPrefillBudget``; a ``MambaSlotAllocator`` beside the full pool),
re-driven by ``PassDriver``. The mirror (``admission.head_check`` with
``admission_hybrid``) must agree on every pass of both hybrid samples and on
generated states around each bound: the SWA budget's (found by bisecting the
real code over the free SWA count, then checked one below, at and one above),
a ring's, the continuing chunk's SWA cap, the never-fits cut, the ignore_eos
path; and the mamba state slots, which admission does not read.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import msgspec
import pytest
from test_stall_rule import CHUNKED, FIRST, HEAD, RUNNING, SAMPLES, assert_agrees

from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.analysis import admission
from schedtrace.tracer.analysis.admission import head_check
from schedtrace.tracer.analysis.admission_hybrid import SWA_BOUND, SWA_LOCK_NOTE
from schedtrace.tracer.analysis.decision import recorded_decision, replay_inputs
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.analysis.why import why
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import Candidate, Header, KvSnapshot, Pass, PoolLayout, WaitingReq

HYBRID_SAMPLES = [p for p in SAMPLES if p.name.startswith("hybrid-")]
FULL_FREE = 30000  # the full pool never binds in the SWA cases


def agrees(driver: PassDriver, header: Header, p: Pass, *, exact: bool = True) -> tuple[Decision, int]:
    """``assert_agrees``, and the mirror sizes every admitted request as the real pass
    does; returns the real decision and how many checks were compared."""
    real = assert_agrees(driver, header, p, exact=exact)
    p = replay_inputs(p)
    first = 1 if real.chunk_size is not None else 0
    for k in range(first, len(real.admitted)):
        check = head_check(p, header, real.admitted[:k])
        size = check.extend if check.cut is None else check.cut
        assert (check.rid, size) == real.admitted[k], (p.seq, k, check, real)
    return real, (p.chunked is not None) + len(real.admitted) - first + 1


@pytest.mark.parametrize("path", HYBRID_SAMPLES, ids=lambda p: p.name)
def test_rule_agrees_with_the_real_fixed_pass_on_every_hybrid_sample_pass(path: Path) -> None:
    checks = admitted = refused = 0
    estimates: set[str] = set()
    with TraceReader(path) as reader:
        header = reader.header
        driver = PassDriver(header)
        for p in reader.passes():
            real, n = agrees(driver, header, p, exact=False)
            checks, admitted = checks + n, admitted + len(real.admitted)
            stop = head_check(p, header, real.admitted)
            refused += stop.verdict in (admission.NO_SLOT, admission.NO_TOKEN)
            estimates.update(head_check(p, header).estimate)
    print(f"{path.name}: {checks} checks agree")  # the count the report quotes (pytest -s)
    # Admissions and refusals both occur, and no check is an estimate: the samples record
    # every input the rule reads (on SWA the share of each prefix lock too).
    assert admitted > 30 and refused > 100 and not estimates, (admitted, refused, estimates)


# ------------------------------------------------------------ generated states

def swa_header(page: int = 1, window: int | None = 127, ring: int = 0, size: int = 13107, radix: bool = True) -> Header:
    pools = PoolLayout("SWATokenToKVPoolAllocator", "UnifiedRadixCache", 40000, swa_size=size,
                       swa_ring_cost=ring, sliding_window=window)
    args = builders.server_args(page_size=page, disable_radix_cache=not radix)
    return builders.header(server_args=args, is_hybrid_swa=True, pools=pools)


@lru_cache(maxsize=None)
def swa_server(**fields) -> tuple[Header, PassDriver]:
    header = swa_header(**fields)
    return header, PassDriver(header)


def swa_pass(swa_free: int, *, waiting=(HEAD,), running=(), chunked=None, swa_evictable=0,
             candidates=(), slots=10) -> Pass:
    return builders.pass_record(
        0, waiting=list(waiting), running=list(running), chunked=chunked, candidates=list(candidates),
        kv=KvSnapshot(FULL_FREE, 0, swa_available=swa_free, swa_evictable=swa_evictable),
        req_slots_free=slots, chunked_prefill_size=8192,
    )


def real_flip(driver: PassDriver, make: Callable[[int], Pass], lo: int, hi: int) -> int:
    """The least free SWA count at which the real fixed pass admits the head."""
    admits = lambda free: any(rid == "head" for rid, _ in driver.decide(make(free), "fixed").admitted)  # noqa: E731
    assert not admits(lo) and admits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if admits(mid) else (mid, hi)
    return hi


HEAD_PREFIX = msgspec.structs.replace(HEAD, prefix_len=400)
SCENARIOS: dict[str, tuple[dict, Callable[[int], Pass], bool]] = {
    # name: (server, pass for a free SWA count, whether the mirror claims exactness)
    "head": ({}, lambda f: swa_pass(f), True),
    "head-page16": ({"page": 16}, lambda f: swa_pass(f), True),
    "running": ({}, lambda f: swa_pass(f, running=RUNNING), True),
    "second": ({"page": 16}, lambda f: swa_pass(f, waiting=(FIRST, HEAD)), True),
    "after-chunk": ({}, lambda f: swa_pass(f, chunked=CHUNKED), True),
    "no-window": ({"window": None}, lambda f: swa_pass(f, waiting=(FIRST, HEAD)), True),
    # The head's prefix lock pins SWA evictable tokens: recorded, or assumed (an estimate).
    "lock-recorded": ({}, lambda f: swa_pass(f, waiting=(HEAD_PREFIX,), swa_evictable=500,
                                             candidates=[Candidate("head", 400, 0, "NO_TOKEN", 400, 60)]), True),
    "lock-assumed": ({}, lambda f: swa_pass(f, waiting=(HEAD_PREFIX,), swa_evictable=500), False),
    "ignore-eos": ({"radix": False}, lambda f: swa_pass(f, waiting=(msgspec.structs.replace(HEAD, ignore_eos=True),),
                                                       running=RUNNING), True),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_swa_bound_agrees_one_below_at_and_one_above_the_flip(name: str) -> None:
    server, make, exact = SCENARIOS[name]
    header, driver = swa_server(**server)
    flip = real_flip(driver, make, 0, 20000)
    for free in (flip - 1, flip, flip + 1):
        agrees(driver, header, make(free), exact=exact)
    below = head_check(make(flip - 1), header, [a for a in driver.decide(make(flip - 1), "fixed").admitted])
    assert below.rid == "head" and below.verdict == admission.NO_TOKEN and below.bound == SWA_BOUND
    assert (SWA_LOCK_NOTE in below.estimate) == (not exact)


@pytest.mark.parametrize("page", [1, 16])
def test_a_head_alone_needs_its_paged_extend_and_a_page_strictly_below_the_swa_budget(page) -> None:
    """The flip found above, by hand: a 127-token window over a 1003-token head reserves
    the tail past the window + one window + a page; free must exceed it."""
    header, driver = swa_server(page=page)
    paged = -(-HEAD.input_len // page) * page
    assert real_flip(driver, swa_pass, 0, 20000) == (paged - 127) + 127 + page + 1


def test_a_per_request_ring_admits_at_equality() -> None:
    """A ring's bound is not strict: one free row is exactly one ring, and it fits."""
    header, driver = swa_server(ring=256, size=4096)
    for p in (swa_pass(0, slots=1), swa_pass(0, slots=1, chunked=CHUNKED)):
        real, _ = agrees(driver, header, p)
        assert any(rid == "head" for rid, _ in real.admitted)


@pytest.mark.parametrize("free", [0, 1, 2, 1500, 1501, 1502, 6000])
def test_the_continuing_chunk_is_capped_and_deferred_by_the_swa_side(free) -> None:
    header, driver = swa_server()
    real, _ = agrees(driver, header, swa_pass(free, chunked=CHUNKED))
    assert (real.chunk_size is None) == (free <= 1)  # SWA budget − a page ≤ 0: deferred


@pytest.mark.parametrize("free", [1000, 1700, 1800, 1900])
def test_a_head_that_never_fits_the_swa_pool_is_cut_to_what_it_leaves(free) -> None:
    """No window: the head's SWA need (extend + decode + page) is at least the pool,
    so sglang cuts it to the SWA budget less the decode headroom."""
    header, driver = swa_server(window=None, size=2000)
    head = WaitingReq("head", 3000, 0, 200, 0)
    real, _ = agrees(driver, header, swa_pass(free, waiting=(head,)))
    assert real.admitted == [("head", free - 201)]


# ------------------------------------------------------------ mamba state slots

MAMBA_LAYOUT = PoolLayout("TokenToKVPoolAllocator", "UnifiedRadixCache", 40000, mamba_size=24,
                          mamba_slots_per_req=1, mamba_strategy="no_buffer")


@lru_cache(maxsize=None)
def mamba_server(page: int = 1, exact_fill: bool = False) -> tuple[Header, PassDriver]:
    header = builders.header(server_args=builders.server_args(page_size=page), is_hybrid_mamba=True,
                             pools=MAMBA_LAYOUT, exact_chunk_fill=exact_fill)
    return header, PassDriver(header)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_mamba_state_slots_do_not_enter_admission(delta) -> None:
    """Free state slots one below, at and one above the head's one: the real check
    decides on the full pool alone (slots are reclaimed after the batch is chosen)."""
    header, driver = mamba_server()
    need = HEAD.input_len + HEAD.max_new_tokens + 1
    decisions = set()
    for slots in (0, 1, 2):
        p = builders.pass_record(0, waiting=[HEAD], req_slots_free=10,
                                 kv=KvSnapshot(need - delta, 0, mamba_available=slots, mamba_evictable=0))
        real, _ = agrees(driver, header, p)
        decisions.add(tuple(real.admitted))
    assert decisions == {(("head", HEAD.input_len),) if delta < 0 else ()}


def test_a_mamba_tree_sharing_prefixes_bills_chunks_by_page() -> None:
    header, driver = mamba_server(page=16, exact_fill=True)
    head = WaitingReq("head", 3000, 0, 50, 37)
    p = builders.pass_record(0, waiting=[head], chunked_prefill_size=1000, req_slots_free=10,
                             kv=KvSnapshot(20000, 100, mamba_available=5, mamba_evictable=0))
    real, _ = agrees(driver, header, p)
    # Billed exactly it would be 1000; by page: (37 + 1000 // 16 * 16) // 16 * 16 − 37.
    assert real.admitted == [("head", 987)]


# ------------------------------------------------------------ what stays an estimate

def test_only_unmirrored_pools_and_unrecorded_swa_locks_are_estimates() -> None:
    p = swa_pass(5000)
    assert head_check(p, swa_header()).exact
    unified = builders.header(is_hybrid_swa=True, pools=msgspec.structs.replace(
        swa_header().pools, allocator="UnifiedSWATokenToKVPoolAllocator"))
    assert head_check(p, unified).estimate == ("UnifiedSWATokenToKVPoolAllocator budget not mirrored",)
    both = msgspec.structs.replace(swa_header(), is_hybrid_mamba=True)
    assert not head_check(p, both).exact
    priced = builders.header(is_hybrid_mamba=True, pools=msgspec.structs.replace(MAMBA_LAYOUT, mamba_slot_cost=64))
    assert not head_check(p, priced).exact
    assert head_check(p, mamba_server()[0]).exact
    locked = swa_pass(5000, waiting=(HEAD_PREFIX,), swa_evictable=500)
    line = why(locked, swa_header(), Decision(admitted=[]))
    assert line.text.endswith(f"(estimate: {SWA_LOCK_NOTE})")


def test_why_names_the_swa_budget_and_the_scanner_counts_estimates() -> None:
    header, _ = swa_server()
    line = why(swa_pass(1000), header, Decision(admitted=[]))
    assert line.reason == "back-pressure" and "SWA budget 1000 too small for head's 1004 SWA tokens" in line.text
    scanner = StallScanner(1, header)
    scanner.feed_pass(swa_pass(5000, waiting=(HEAD_PREFIX,), swa_evictable=500), Decision(admitted=[]))
    scanner.feed_pass(swa_pass(5000), Decision(admitted=[]), seq=1)  # the next pass: one run
    assert scanner.estimates == {SWA_LOCK_NOTE: 1} and len(scanner.finish()) == 1
    with TraceReader(HYBRID_SAMPLES[0]) as reader:  # a whole sample, as info scans it
        scanner = StallScanner(8, reader.header)
        for p in reader.passes():
            scanner.feed_pass(p, recorded_decision(p))
    assert scanner.finish() == []
