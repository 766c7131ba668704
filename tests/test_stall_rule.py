"""The stall rule agrees with sglang's own admission check (issue 13).

``admission.head_check`` is a pure mirror of ``PrefillAdder``'s arithmetic;
the oracle here is the real sglang pass under the fixed logic, re-driven by
``PassDriver``. The mirror must give the same verdict for every request the
real pass admits, for the request it stops at, and for the continuing chunk:
on every pass of every sample trace and on generated states at the boundary
(need = budget − 1, = budget, = budget + 1).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import msgspec
import pytest

from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.analysis import admission
from schedtrace.tracer.analysis.admission import head_check
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.analysis.stalls import both_stalled, find_stalls, is_stalled
from schedtrace.tracer.analysis.why import why, why_trace
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import (
    Arrival,
    Candidate,
    ChunkedReq,
    Finish,
    Header,
    KvSnapshot,
    Pass,
    PoolLayout,
    Retract,
    RunningReq,
    WaitingReq,
)

TRACES = Path(__file__).resolve().parent.parent / "traces"
SAMPLES = sorted(TRACES.glob("*.trace"))
LPM = TRACES / "kv-pressure-lpm-24k.trace"
HEAD_RID = "daeaf5eb3d714493876b87c45e2b242d"  # the LPM sample's queue head at pass 867


def assert_agrees(driver: PassDriver, header: Header, p: Pass, *, exact: bool = True) -> Decision:
    """The mirror and the real fixed pass agree on the chunk and on every request
    the pass admits and the one it stops at; returns the real decision.
    ``exact``: the mirror must also claim to be exact (not an estimate)."""
    p = replay_inputs(p)
    real = driver.decide(p, "fixed")
    assert real.error is None, real.error
    own = head_check(p, header)
    assert own.exact or not exact, own.estimate
    if p.chunked is not None:
        assert (own.chunk, own.chunk_budget) == (real.chunk_size, real.chunk_budget), (p.seq, own, real)
    first = 1 if real.chunk_size is not None else 0
    queue = [rid for rid, _ in real.admitted[first:]]
    for k in range(len(queue) + 1):
        check = head_check(p, header, real.admitted[: first + k])
        if k < len(queue):
            assert check.admits and check.rid == queue[k], (p.seq, k, check, real)
        else:
            assert not check.admits, (p.seq, k, check, real)
    return real


# The hybrid samples (SWA, mamba) are checked in tests/test_stall_rule_hybrid.py.
# The preempting sample too: the rule's pass scaffold runs without priority scheduling.
FULL_POOL_SAMPLES = [p for p in SAMPLES if not p.name.startswith("hybrid-") and p.name != "priority-preempt-fcfs.trace"]


@pytest.mark.parametrize("path", FULL_POOL_SAMPLES, ids=lambda p: p.name)
def test_rule_agrees_with_the_real_fixed_pass_on_every_sample_pass(path: Path) -> None:
    with TraceReader(path) as reader:
        header = reader.header
        driver = PassDriver(header)
        admitted = 0
        stops: dict[str, int] = {}
        for p in reader.passes():
            real = assert_agrees(driver, header, p)
            admitted += len(real.admitted)
            verdict = head_check(p, header, real.admitted).verdict
            stops[verdict] = stops.get(verdict, 0) + 1
    # Admissions and refusals both occur, so agreement is not vacuous (fcfs
    # stops on slots, lpm on the KV budget, the latch workload on its KV-blocked head).
    refused = stops.get(admission.NO_SLOT, 0) + stops.get(admission.NO_TOKEN, 0)
    assert admitted > 50 and refused > (10 if path.name == "latch-abort-live.trace" else 1000), stops


# ----------------------------------------------------------- generated states

PAGE_SIZES = [1, 16]
CHUNK = 8192


@lru_cache(maxsize=None)
def server(page: int = 1, policy: str = "fcfs", radix: bool = True) -> tuple[Header, PassDriver]:
    header = builders.header(
        server_args=builders.server_args(page_size=page, schedule_policy=policy, disable_radix_cache=not radix)
    )
    return header, PassDriver(header)


def ceil(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


HEAD = WaitingReq("head", 1003, 0, 200, 0)  # 1003: not a whole number of 16-token pages
FIRST = WaitingReq("first", 705, 0, 100, 0)
CHUNKED = ChunkedReq("long", 9000, 4000, 300, 0, False)  # 5000 left: finishes this pass
RUNNING = [RunningReq(f"run-{k}", 500, 50, 250, True) for k in range(3)]  # 200 decode each


def boundary_pass(page: int, running: bool, position: str, delta: int) -> Pass:
    """A pass whose head needs ``delta`` tokens more than its budget (sglang's terms:
    extend + decode + one page against free + evictable − reserved)."""
    need = HEAD.input_len + HEAD.max_new_tokens + page
    reserved = 3 * 200 if running else 0
    waiting = [HEAD]
    chunked = None
    if position == "second":  # one admission first: page-rounded extend + a page + its decode
        waiting = [FIRST, HEAD]
        reserved += ceil(FIRST.input_len, page) + page + FIRST.max_new_tokens
    elif position == "after-chunk":  # the continuing chunk runs whole first
        chunked = CHUNKED
        reserved += ceil(5000, page) + page + CHUNKED.max_new_tokens
    return builders.pass_record(
        0,
        waiting=waiting,
        running=RUNNING if running else [],
        chunked=chunked,
        kv=KvSnapshot(available=need + reserved - delta, evictable=0),
        req_slots_free=10,
        chunked_prefill_size=CHUNK,
    )


@pytest.mark.parametrize("delta", [-1, 0, 1])
@pytest.mark.parametrize("position", ["head", "second", "after-chunk"])
@pytest.mark.parametrize("running", [False, True], ids=["idle", "running"])
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_the_bound_is_strict_page_rounded_and_counts_earlier_admissions(page, running, position, delta) -> None:
    header, driver = server(page)
    p = boundary_pass(page, running, position, delta)
    real = assert_agrees(driver, header, p)
    after = [a for a in real.admitted if a[0] != "head"]
    check = head_check(p, header, after)
    assert check.rid == "head" and check.need - check.budget == delta
    assert check.admits == (delta < 0) == any(rid == "head" for rid, _ in real.admitted)


@pytest.mark.parametrize("ratio", [0.37, 0.4, 0.7])
@pytest.mark.parametrize("side", [-1, 1])
def test_a_fractional_decode_reservation_is_compared_as_sglang_does(ratio, side) -> None:
    header, driver = server()
    running = [RunningReq(f"run-{k}", 500, 50, 250 + k, False) for k in range(3)]
    reserved = sum((200 + k) * ratio for k in range(3))
    need = HEAD.input_len + HEAD.max_new_tokens + 1
    whole = int(reserved) + (1 if side > 0 else 0)  # budget just above or just below the need
    p = builders.pass_record(
        0, waiting=[HEAD], running=running, new_token_ratio=ratio,
        kv=KvSnapshot(available=need + whole, evictable=0), req_slots_free=10,
    )
    real = assert_agrees(driver, header, p)
    assert bool(real.admitted) == (side > 0) == head_check(p, header).admits


@pytest.mark.parametrize("recorded_drop", [None, 250])
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_locking_the_heads_prefix_takes_its_share_of_the_evictable_count(recorded_drop, delta) -> None:
    header, driver = server()
    head = msgspec.structs.replace(HEAD, prefix_len=400)
    drop = 400 if recorded_drop is None else recorded_drop
    need = head.input_len - 400 + head.max_new_tokens + 1
    candidates = [] if recorded_drop is None else [Candidate("head", 400, 0, "NO_TOKEN", recorded_drop)]
    p = builders.pass_record(
        0, waiting=[head], candidates=candidates, req_slots_free=10,
        kv=KvSnapshot(available=need - delta - (1000 - drop), evictable=1000),
    )
    real = assert_agrees(driver, header, p)
    check = head_check(p, header)
    assert check.evictable == 1000 - drop and check.need - check.budget == delta
    assert bool(real.admitted) == (delta < 0)


def flip_point(driver: PassDriver, make, lo: int, hi: int) -> int:
    """The least free-KV count at which the real fixed pass admits the head."""
    admits = lambda available: bool(driver.decide(make(available), "fixed").admitted)  # noqa: E731
    assert not admits(lo) and admits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if admits(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("page", PAGE_SIZES)
@pytest.mark.parametrize("running", [False, True], ids=["idle", "running"])
def test_the_ignore_eos_path_without_radix_cache_agrees_at_its_boundary(page, running) -> None:
    header, driver = server(page, radix=False)
    head = msgspec.structs.replace(HEAD, ignore_eos=True)
    decoding = [RunningReq(f"run-{k}", 500, 50 + 40 * k, 250, k != 1) for k in range(3)] if running else []

    def make(available: int) -> Pass:
        return builders.pass_record(0, waiting=[head, FIRST], running=decoding,
                                    kv=KvSnapshot(available=available, evictable=0), req_slots_free=10)

    flip = flip_point(driver, make, 0, 20000)
    for available in range(flip - 2, flip + 3):
        assert_agrees(driver, header, make(available))
    assert head_check(make(flip - 1), header).verdict == admission.NO_TOKEN
    assert head_check(make(flip), header).admits


@pytest.mark.parametrize(("running", "rows", "verdict"), [
    (12, 5, admission.NO_SLOT),  # max_running_requests reached
    (11, 0, admission.NO_SLOT),  # no request-pool row
    (11, 1, admission.ADMITS),
])
def test_request_slots_bound_admission(running, rows, verdict) -> None:
    header, driver = server()
    p = builders.pass_record(
        0, waiting=[HEAD], running=[RunningReq(f"run-{k}", 100, 1, 2, True) for k in range(running)],
        kv=KvSnapshot(available=30000, evictable=0), req_slots_free=rows,
    )
    assert_agrees(driver, header, p)
    assert head_check(p, header).verdict == verdict


def test_lpm_checks_the_longest_prefix_first() -> None:
    header, driver = server(policy="lpm")
    waiting = [WaitingReq("a", 900, 0, 50, 0), WaitingReq("b", 900, 0, 50, 300), WaitingReq("c", 900, 0, 50, 100)]
    p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=1900, evictable=400), req_slots_free=10)
    real = assert_agrees(driver, header, p)
    assert [rid for rid, _ in real.admitted][:1] == ["b"] == [head_check(p, header).rid]


def test_a_continuing_chunk_runs_first_and_a_second_chunk_waits() -> None:
    header, driver = server()
    p = builders.pass_record(0, waiting=[WaitingReq("head", 6000, 0, 100, 0)],
                             chunked=ChunkedReq("long", 20000, 4000, 300, 0, False),
                             kv=KvSnapshot(available=30000, evictable=0), req_slots_free=10)
    real = assert_agrees(driver, header, p)
    assert real.chunk_size == CHUNK and head_check(p, header).verdict == admission.PASS_BUDGET
    assert is_stalled(p, Decision(admitted=[]), header)  # an arm that ran no chunk: the fixed one runs it
    # On the 64-token mamba grid the chunk is cut to 960 of 1000 and leaves 40
    # tokens of chunk budget; the head would need a second unfinished chunk.
    grid = builders.header(server_args=builders.server_args(chunked_prefill_size=1000), mamba_chunk_grid=64)
    cut = msgspec.structs.replace(p, chunked_prefill_size=1000)
    real = assert_agrees(PassDriver(grid), grid, cut)
    assert real.chunk_size == 960 and head_check(cut, grid).verdict == admission.ONE_CHUNK
    assert "one chunked request" in why(cut, grid, real).text


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_mixed_chunk_decode_rows_start_the_offsets(delta) -> None:
    header = builders.header(server_args=builders.server_args(enable_mixed_chunk=True))
    p = boundary_pass(1, True, "head", delta - 3)  # three free tokens more for the three decode rows
    real = assert_agrees(PassDriver(header), header, p)
    assert head_check(p, header).need - head_check(p, header).budget == delta
    assert bool(real.admitted) == (delta < 0)


def _queue(n: int) -> list[WaitingReq]:
    return [WaitingReq(f"w{k:03}", 300 + 7 * (k % 5), 0, 20 + 13 * (k % 7), 11 * (k % 4), k % 3) for k in range(n)]


@pytest.mark.parametrize(("policy", "priority", "n"), [
    ("lof", False, 6), ("lof", True, 6), ("fcfs", True, 6), ("lpm", False, 6), ("lpm", False, 130),
])
def test_the_policies_queue_order_is_mirrored(policy, priority, n) -> None:
    header = builders.header(
        server_args=builders.server_args(schedule_policy=policy, enable_priority_scheduling=priority)
    )
    p = builders.pass_record(0, waiting=_queue(n), kv=KvSnapshot(available=1500, evictable=200), req_slots_free=10)
    real = assert_agrees(PassDriver(header), header, p)
    assert len(real.admitted) >= 2  # the order of more than the head is compared


@pytest.mark.parametrize("exact_fill", [False, True])
@pytest.mark.parametrize("grid", [1, 64])
@pytest.mark.parametrize("prefix", [0, 37])
def test_a_head_longer_than_the_chunk_budget_is_cut_as_sglang_cuts_it(exact_fill, grid, prefix) -> None:
    header = builders.header(server_args=builders.server_args(page_size=16, chunked_prefill_size=1000),
                             exact_chunk_fill=exact_fill, mamba_chunk_grid=grid)
    head = WaitingReq("head", 3000, 0, 50, prefix)
    p = builders.pass_record(0, waiting=[head], chunked_prefill_size=1000,
                             kv=KvSnapshot(available=20000, evictable=100), req_slots_free=10)
    real = assert_agrees(PassDriver(header), header, p)
    assert real.admitted == [("head", head_check(p, header).cut)]


def test_the_rule_says_where_it_is_an_estimate() -> None:
    p = boundary_pass(1, False, "head", -1)
    header, _ = server()
    assert head_check(p, header).exact
    assert not head_check(p, 12).exact  # only max_running_requests: page size 1 assumed
    pools = PoolLayout("SWATokenToKVPoolAllocator", "SWARadixCache", 30000, swa_size=8000, sliding_window=128)
    swa = builders.header(is_hybrid_swa=True, pools=pools)
    assert not head_check(p, swa).exact  # an SWA header, and the pass has no SWA free count
    swa_pass = msgspec.structs.replace(p, kv=KvSnapshot(p.kv.available, 0, swa_available=8000, swa_evictable=0))
    assert head_check(swa_pass, swa).exact  # the SWA budget is mirrored (tests/test_stall_rule_hybrid.py)
    dfs = builders.header(server_args=builders.server_args(schedule_policy="dfs-weight"))
    assert "dfs-weight queue order not mirrored" in head_check(p, dfs).estimate
    assert "(estimate: " in why(p, dfs, Decision(admitted=[])).text


# ----------------------------------------------------- the LPM sample's latch


@pytest.fixture(scope="module")
def lpm_window() -> tuple[Header, list[Pass], list[Decision], list[Decision]]:
    with TraceReader(LPM) as reader:
        header = reader.header
        passes = [replay_inputs(reader.pass_at(n)) for n in range(850, 900)]
    driver = PassDriver(header)
    return header, passes, [driver.decide(p, "stock") for p in passes], [driver.decide(p, "fixed") for p in passes]


def test_the_lpm_latch_holds_back_an_admittable_head_for_one_pass(lpm_window) -> None:
    """At 867 stock stays latched and the fixed check admits (2415 < 2421); from
    868 the real check refuses (2415 ≥ 2414) in both arms: back-pressure."""
    header, passes, stock, fixed = lpm_window
    (stall,) = find_stalls(passes, stock, 1, header)
    assert (stall.start_pass, stall.end_pass, stall.passes, stall.head_rid) == (867, 867, 1, HEAD_RID)
    assert find_stalls(passes, stock, DEFAULT_STALL_PASSES, header) == []
    assert find_stalls(passes, fixed, 1, header) == []
    at = {p.seq: p for p in passes}
    assert [rid for rid, _ in fixed[867 - 850].admitted] == [HEAD_RID]
    assert fixed[868 - 850].admitted == [] and stock[868 - 850].admitted == []
    check = head_check(at[868], header)
    assert (check.need, check.budget, check.verdict) == (2228 + 186 + 1, 2414, admission.NO_TOKEN)


def test_why_explains_the_latch_and_the_back_pressure_after_it(lpm_window) -> None:
    header, passes, _, fixed = lpm_window
    lines = {w.seq: w for w in why_trace(passes, header)}
    assert lines[867].reason == "latch"
    assert lines[867].text == "latched since 866; 4 slots free; head needs 2415, budget 2421 → the latch fix admits"
    assert lines[868].reason == "back-pressure"
    assert lines[868].text == (
        "latched since 866, and budget 2414 ≤ head 2415 (307 free + 2980 evictable − 873 reserved) → back-pressure"
    )
    # Under the fixed decision 867 admitted the head; the line is about the next request.
    after = why(passes[867 - 850], header, fixed[867 - 850])
    assert after.text.startswith("admitted 1; next 4ae2aea7: ") and after.reason == "back-pressure"


def test_why_names_a_stall_the_latch_does_not_explain_and_a_raise() -> None:
    header, _ = server()
    p = boundary_pass(1, True, "head", -1)
    assert why(p, header, Decision(admitted=[])).reason == "stall"
    assert why(p, header, Decision(admitted=[], error="AssertionError: ")).text == "raised AssertionError: "
    full = msgspec.structs.replace(p, req_slots_free=0)
    assert why(full, header, Decision(admitted=[])).reason == "full"


def test_why_says_which_pass_budget_the_chunk_spent() -> None:
    header, driver = server()
    p = builders.pass_record(0, waiting=[WaitingReq("head", 600, 0, 100, 0)],
                             chunked=ChunkedReq("long", 20000, 4000, 300, 0, False),
                             kv=KvSnapshot(available=30000, evictable=0), req_slots_free=10)
    line = why(p, header, driver.decide(p, "fixed"))
    assert (line.reason, line.text) == ("pass-budget", "admitted 1; next head: chunk budget spent (rem_chunk_tokens 0) → next pass")


def test_a_pass_number_lost_between_stalled_passes_ends_the_run() -> None:
    from schedtrace.tracer.analysis.stalls import StallScanner

    def stalls(seqs: list[int], min_passes: int) -> list[tuple[int, int, int]]:
        scanner = StallScanner(min_passes)
        for seq in seqs:
            scanner.feed(seq, 1, 0, True, "head")
        return [(s.start_pass, s.end_pass, s.passes) for s in scanner.finish()]

    whole = list(range(10))
    holed = [s for s in whole if s != 5]  # pass 5 lost in an unreadable region
    assert stalls(whole, 8) == [(0, 9, 10)]
    assert stalls(holed, 8) == []  # two runs of 5 and 4: neither is a stall of 8
    assert stalls(holed, 3) == [(0, 4, 5), (6, 9, 4)]


def test_info_says_on_how_many_passes_the_rule_was_an_estimate(tmp_path: Path) -> None:
    from schedtrace.tracer.analysis.summary import summarize
    from schedtrace.tracer.contract.format import write_trace

    fits = boundary_pass(1, False, "head", -1)  # the head fits: a pass that admits nothing is a stall
    passes = [msgspec.structs.replace(fits, seq=n) for n in range(3)]
    for policy, expected in (("fcfs", {}), ("dfs-weight", {"dfs-weight queue order not mirrored": 3})):
        path = tmp_path / f"{policy}.trace"
        write_trace(path, builders.header(server_args=builders.server_args(schedule_policy=policy)), passes)
        with TraceReader(path) as reader:
            anomalies = summarize(reader, 1)["anomalies"]
        assert len(anomalies["stalls_while_kv_free"]) == 1
        assert anomalies["stall_rule_estimates"] == expected


def test_two_arms_checked_at_once_stall_as_each_checked_alone() -> None:
    """The replayer checks a pass once for both arms (both_stalled): on every pass of the latch sample,
    with each arm's replayed decision, the pair is is_stalled's for each."""
    path = TRACES / "latch-abort-live.trace"
    seen = set()
    with TraceReader(path) as reader:
        header = reader.header
        driver = PassDriver(header)
        for _, record in reader.records():
            if type(record) in (Arrival, Finish, Retract):
                driver.note(record)
            elif type(record) is Pass:
                p = replay_inputs(record)
                old, new = driver.decide(p, "stock"), driver.decide(p, "fixed")
                pair = both_stalled(p, old, new, header)
                assert pair == (is_stalled(p, old, header), is_stalled(p, new, header)), record.seq
                seen.add(pair)
                driver.note(record)
    assert {(True, False), (False, False)} <= seen
