"""The closed loop's self-check (schedtrace.replay.loop.selfcheck): the stock arm, run
with the real sglang code (PassDriver), against what the recording shows."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import msgspec
import pytest

from schedtrace.replay.loop.run import run_closed_loop
from schedtrace.replay.loop.selfcheck import concordance, quantile, self_check_lines, self_check_summary
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Admitted, Arrival, Finish, KvSnapshot, Pass, WaitingReq

from loop_traces import MS, latch_reproduction

REPO = Path(__file__).resolve().parent.parent
# The preempting sample is within the matrix's bounds, not exact (0.0% / 1.4%): tests/test_sample_traces.py.
SAMPLES = sorted(p for p in (REPO / "traces").glob("*.trace") if p.name != "priority-preempt-fcfs.trace")
# The sandbox's overload recordings (traces/README.md); the latch workload is a short scripted one.
OVERLOAD_SAMPLES = {"kv-pressure-fcfs.trace", "kv-pressure-lpm-24k.trace", "hybrid-mamba-kimi.trace",
                    "hybrid-swa-gptoss.trace"}


# ----------------------------------------------------------------- figures


def brute_force(xs, ys):
    """Concordant and discordant pairs, and tau-b, pair by pair."""
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(xs)), 2):
        dx, dy = xs[i] - xs[j], ys[i] - ys[j]
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            tx += 1
        elif dy == 0:
            ty += 1
        elif (dx > 0) == (dy > 0):
            c += 1
        else:
            d += 1
    tau = (c - d) / math.sqrt((c + d + tx) * (c + d + ty)) if (c + d + tx) and (c + d + ty) else 1.0
    return (c / (c + d) if c + d else 1.0), tau


def test_quantile_is_nearest_rank():
    assert quantile([], 0.5) == 0
    assert quantile([7], 0.9) == 7
    assert quantile([4, 1, 3, 2], 0.5) == 2  # rank ceil(0.5 * 4) = 2
    assert quantile([4, 1, 3, 2], 0.9) == 4
    assert quantile(list(range(1, 11)), 0.9) == 9


def test_concordance_by_hand():
    # Recorded order c < b < a, loop order b < c < a: (a,b) and (a,c) agree, (b,c) does not.
    agreement, tau = concordance([10, 8, 7], [6, 3, 4])
    assert agreement == pytest.approx(2 / 3) and tau == pytest.approx(1 / 3)
    # A tie on one side is left out of the agreement and counted by tau-b.
    agreement, tau = concordance([1, 1, 2], [1, 2, 3])
    assert agreement == 1.0 and tau == pytest.approx(2 / math.sqrt(2 * 3))
    assert concordance([], []) == (1.0, 1.0) and concordance([5, 5], [1, 2]) == (1.0, 1.0)


def test_concordance_matches_the_pair_by_pair_count():
    rng = random.Random(13)
    for n in (2, 3, 17, 60):
        xs = [rng.randrange(8) for _ in range(n)]
        ys = [rng.randrange(8) for _ in range(n)]
        assert concordance(xs, ys) == pytest.approx(brute_force(xs, ys))


# ------------------------------------------------------------ exact replays


@pytest.mark.parametrize("trace", SAMPLES, ids=lambda p: p.name)
def test_the_stock_closed_loop_reproduces_each_sample_recording(trace):
    """Recorded by the sandbox under overload (traces/README.md): every request's
    first-admission wait, the queue peak and the completion order come out as recorded."""
    with TraceReader(trace) as reader:
        records = [r for _, r in reader.records()]
        running_slots = reader.header.max_req_slots  # the request pool: the running cap the server ran with
    ended = {r.rid for r in records if isinstance(r, Finish)}
    ran = {a.rid for r in records if isinstance(r, Pass) for a in r.admitted}  # a client may abort one waiting
    loop = run_closed_loop(trace, ["stock"])
    check = loop.self_check
    assert check is not None and check.arm == "stock"
    assert check.requests == len(ran) and check.finished == len(ended) >= len(ran) >= 10
    assert check.recorded_only == 0 and check.loop_only == 0
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0)
    assert (check.loop_wait_p50, check.loop_wait_p90) == (check.recorded_wait_p50, check.recorded_wait_p90)
    assert check.loop_queue_peak == check.recorded_queue_peak
    assert (check.order_agreement, check.kendall_tau) == (1.0, 1.0)
    if trace.name in OVERLOAD_SAMPLES:
        assert len(ran) > 30 and check.recorded_wait_p90 > 100  # requests waited a hundred passes and more
        assert check.recorded_queue_peak > running_slots  # more waited than could run


def test_no_stock_arm_no_self_check(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    assert run_closed_loop(trace, ["fixed"]).self_check is None
    assert run_closed_loop(trace, ["stock", "fixed"]).self_check is not None


# ---------------------------------------------------------- a recording off


def unfaithful_recording(path: Path) -> Path:
    """A recording the real code does not make: "b" waits 3 passes with KV and slots free.

    Passes 1 ms apart, so pass n is recorded pass n. "a" is queued at the
    start, "b" arrives before pass 1, "c" before pass 2; the recording admits
    a at 0, c at 2 and b only at 4, and finishes c, b, a at passes 7, 8, 10.
    """
    kv = KvSnapshot(available=30000, evictable=0)

    def queued(rid: str) -> WaitingReq:
        return WaitingReq(rid, 100, 0, 8, 0, None, True)

    queues = {0: ["a"], 1: ["b"], 2: ["b", "c"], 3: ["b"], 4: ["b"]}
    admits = {0: "a", 2: "c", 4: "b"}
    passes = [
        builders.pass_record(n, waiting=[queued(r) for r in queues.get(n, [])], kv=kv, req_slots_free=12,
                             admitted=[Admitted(admits[n], 0, 100)] if n in admits else [])
        for n in range(11)
    ]
    arrivals = [Arrival(t_ns=0, rid="a", input_len=100, max_new_tokens=8, ignore_eos=True),
                Arrival(t_ns=MS // 2, rid="b", input_len=100, max_new_tokens=8, ignore_eos=True),
                Arrival(t_ns=3 * MS // 2, rid="c", input_len=100, max_new_tokens=8, ignore_eos=True)]
    finishes = [Finish(t_ns=13 * MS // 2, rid="c", output_len=3, reason="length"),
                Finish(t_ns=15 * MS // 2, rid="b", output_len=2, reason="length"),
                Finish(t_ns=19 * MS // 2, rid="a", output_len=5, reason="length")]
    records = [arrivals[0], passes[0], arrivals[1], passes[1], arrivals[2], *passes[2:7], finishes[0],
               passes[7], finishes[1], *passes[8:10], finishes[2], passes[10]]
    return write_trace(path, builders.header(), records)


def test_a_recording_the_loop_cannot_reproduce_gives_the_hand_computed_errors(tmp_path):
    loop = run_closed_loop(unfaithful_recording(tmp_path / "off.trace"), ["stock"])
    stock = loop.arms["stock"]
    # The real code admits each request on arrival: a at 0, b at 1, c at 2.
    assert stock.first_admission_passes == {"a": 0, "b": 0, "c": 0}
    check = loop.self_check
    # Waits recorded a 0, b 4 - 1 = 3, c 0; the loop 0, 0, 0. Errors |0 - 3| / 3 = 1
    # for b and 0 for the others: nearest-rank p50 of [0, 0, 1] is 0, p90 is 1.
    assert (check.requests, check.wait_error_p50, check.wait_error_p90) == (3, 0.0, 1.0)
    assert (check.recorded_wait_p50, check.recorded_wait_p90) == (0, 3)
    assert (check.loop_wait_p50, check.loop_wait_p90) == (0, 0)
    assert (check.recorded_queue_peak, check.loop_queue_peak) == (2, 1)
    # The loop: prefills at 0, 1, 2 (a prefill pass decodes nothing), then b finishes at
    # step 3, c at 4, a at 6: order b < c < a. Recorded c < b < a: 2 of 3 pairs agree.
    assert check.finished == 3
    assert check.order_agreement == pytest.approx(2 / 3, abs=1e-6)
    assert check.kendall_tau == pytest.approx(1 / 3, abs=1e-6)


def test_the_summary_lines_fit_80_columns_and_carry_the_figures(tmp_path):
    check = run_closed_loop(unfaithful_recording(tmp_path / "off.trace"), ["stock"]).self_check
    lines = self_check_lines(check)
    assert all(len(line) < 80 for line in lines)
    text = "\n".join(lines)
    assert "p50 0.0%, p90 100.0% over 3 requests" in text
    assert "queue peak 2 recorded, 1 loop" in text and "66.7% of pairs agree" in text
    assert "p90 100.0% over 3 requests;" in self_check_summary(check)
    # The error covers only requests admitted on both sides: the one line says how many were not.
    one_sided = msgspec.structs.replace(check, recorded_only=23, loop_only=1)
    assert "over 3 requests (23 admitted only in the recording, 1 only in the loop);" in self_check_summary(one_sided)
