"""The shipped sample traces (traces/): recorded by the real sandbox, replayed
through the real sglang scheduler with full fidelity."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedtrace.replay.loop.run import run_closed_loop
from schedtrace.replay.engine import replay_trace
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Arrival, Pass, Retract

TRACES = Path(__file__).resolve().parent.parent / "traces"
SAMPLES = sorted(TRACES.glob("*.trace"))
# Recorded on the hybrid sandboxes (mamba state slots, SWA): shorter runs of slower forwards.
HYBRID = {"hybrid-mamba-kimi.trace", "hybrid-swa-gptoss.trace"}
# The demo's designed workload (bench/latch_workload.py): one minute of serving.
LATCH_LIVE = "latch-abort-live.trace"
# The matrix's low-first priority server (schedtrace.testing.matrix, fcfs-low-first): 12 preemptions.
PREEMPT = "priority-preempt-fcfs.trace"
SHORT = HYBRID | {LATCH_LIVE, PREEMPT}


def test_there_are_at_least_two_samples_under_five_megabytes() -> None:
    assert len(SAMPLES) >= 2
    for path in SAMPLES:
        assert path.stat().st_size < 5 * 1024 * 1024, path


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_sample_replays_with_full_fidelity(path: Path) -> None:
    with TraceReader(path) as reader:
        assert reader.closed_cleanly and reader.footer.counts["lost"] == 0
        assert reader.header.sglang_version == "0.5.23"
    report = replay_trace(path, "stock", "fixed", jobs=1)
    assert report.fidelity.total == report.passes > (200 if path.name in SHORT else 1000)
    assert report.fidelity.matched == report.fidelity.total, report.fidelity.mismatches[:3]
    assert not report.errors["stock"] and not report.errors["fixed"]


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_hybrid_samples_are_hybrid_and_say_how_each_fix_meets_their_pools(name: str) -> None:
    with TraceReader(TRACES / name) as reader:
        header = reader.header
    assert header.is_hybrid_mamba == ("mamba" in name) and header.is_hybrid_swa == ("swa" in name)
    report = replay_trace(TRACES / name, "stock", "fixed", jobs=1)
    assert sorted(report.fix_notes) == ["aiter", "chunk-cap", "latch", "one-chunk"]
    if header.is_hybrid_swa:
        assert report.fix_notes["latch"].startswith("already present")
        assert report.fix_notes["chunk-cap"].startswith("not reached")
    else:
        assert all(note.startswith("applies") for note in report.fix_notes.values())


def test_lpm_sample_holds_a_real_latch_divergence() -> None:
    report = replay_trace(TRACES / "kv-pressure-lpm-24k.trace", "stock", "fixed", jobs=1)
    [divergence] = report.divergences
    assert divergence.pass_ == 867 and divergence.fixes == ["latch"]
    assert divergence.old.admitted == [] and divergence.old.batch_is_full
    assert [rid for rid, _ in divergence.new.admitted] == ["daeaf5eb3d714493876b87c45e2b242d"]


def test_the_demo_workload_stalls_under_stock_until_a_long_request_leaves() -> None:
    """The client's abort leaves a fitting head behind a latched flag: only the latch fix admits it."""
    report = replay_trace(TRACES / LATCH_LIVE, "stock", "fixed", jobs=1)
    assert len(report.divergences) > 100
    assert {fix for d in report.divergences for fix in d.fixes} == {"latch"}
    [stall] = report.stalls["stock"]
    assert stall.passes > 100 and not report.stalls["fixed"]


def _requeued_victims(path: Path) -> list[int]:
    """Passes whose preemption victim had re-entered the queue (preempted or retracted) after a
    running request of its priority arrived, having arrived before it: only the re-queue ranks it."""
    arrived: dict[str, int] = {}
    requeued: dict[str, int] = {}
    priority: dict[str, int | None] = {}
    passes = []
    with TraceReader(path) as reader:
        for _, record in reader.records():
            if isinstance(record, Arrival):
                arrived[record.rid], priority[record.rid] = record.t_ns, record.priority
            elif isinstance(record, Retract):
                requeued[record.rid] = record.t_ns
            elif isinstance(record, Pass) and record.released:
                for victim in (r.rid for r in record.released if r.rid in requeued):
                    if any(priority[r.rid] == priority[victim] and arrived[victim] < arrived[r.rid] < requeued[victim]
                           for r in record.running if r.rid != victim):
                        passes.append(record.seq)
                for released in record.released:
                    requeued[released.rid] = record.t_ns
    return passes


def test_a_preempted_request_is_ranked_by_its_requeue_not_its_arrival() -> None:
    """sglang picks the newest of the lowest priority by its queue entry, which a preemption
    resets (``_add_request_to_queue``): ranked by arrival, replay released another request."""
    assert _requeued_victims(TRACES / PREEMPT)
    report = replay_trace(TRACES / PREEMPT, "stock", "fixed", jobs=1)
    assert (report.fidelity.matched, report.fidelity.order_matched) == (report.fidelity.total, report.passes)


# A recording for one situation the samples lack (tests/traces/README.md).
RETRACT_THEN_PREEMPT = Path(__file__).resolve().parent / "traces" / "mamba-retract-then-preempt.trace"


def test_a_retracted_request_is_ranked_for_preemption_by_its_requeue() -> None:
    """A retraction re-queues a request as a preemption does: the victim at pass 91 was retracted
    after its rival of the same priority arrived (ranked by its cached arrival, replay released the rival)."""
    assert _requeued_victims(RETRACT_THEN_PREEMPT) == [91]
    report = replay_trace(RETRACT_THEN_PREEMPT, "stock", "fixed", jobs=1)
    assert (report.fidelity.matched, report.fidelity.order_matched) == (report.fidelity.total, report.passes)


RELEASED_TOGETHER = Path(__file__).resolve().parent / "traces" / "fcfs-low-first-released-together.trace"


def _ties_of_one_release(path: Path) -> list[int]:
    """Passes whose preemption chose between running requests of one priority that the same earlier
    preemption had released: only the order they re-entered the queue in ranks them."""
    released_at: dict[str, int] = {}
    priority: dict[str, int | None] = {}
    passes = []
    with TraceReader(path) as reader:
        for _, record in reader.records():
            if isinstance(record, Arrival):
                priority[record.rid] = record.priority
            elif isinstance(record, Pass) and record.released:
                running = {r.rid for r in record.running}
                for victim in (r.rid for r in record.released if r.rid in released_at):
                    if any(rid != victim and released_at.get(rid) == released_at[victim]
                           and priority[rid] == priority[victim] for rid in running):
                        passes.append(record.seq)
                for released in record.released:
                    released_at[released.rid] = record.seq
    return passes


def test_requests_one_preemption_released_requeue_in_the_order_released() -> None:
    """Released together, two requests of one priority re-enter the queue one after the other; the next
    preemption takes the later. Stamped with one time, the tie fell to running order (449/450)."""
    assert _ties_of_one_release(RELEASED_TOGETHER) == [436]
    report = replay_trace(RELEASED_TOGETHER, "stock", "fixed", jobs=1)
    assert (report.fidelity.matched, report.fidelity.order_matched) == (report.fidelity.total, report.passes)
    assert report.passes == 450


STALE_VICTIM = Path(__file__).resolve().parent / "traces" / "fcfs-low-first-stale-victim.trace"


def test_a_request_released_and_admitted_again_ranks_by_its_requeue_under_every_arm() -> None:
    """``w0s2``, released at pass 95, re-entered the queue after ``w1f1m0`` arrived, so the preemption
    at 187 takes it before ``w1f1m0``. The fixed arm, which had not released it at 95, kept its running
    Req with the arrival's entry time; stock reused that Req at 187 and released ``w1f1m0`` (312/313)."""
    with TraceReader(STALE_VICTIM) as reader:
        released = {p.seq: [r.rid for r in p.released] for p in reader.passes() if p.released}
    assert "fcfs-low-first-w0s2" in released[95] and "fcfs-low-first-w0s2" in released[187]
    report = replay_trace(STALE_VICTIM, "stock", "fixed", jobs=1)
    assert (report.fidelity.matched, report.fidelity.order_matched) == (report.fidelity.total, report.passes)


def test_the_closed_loop_preempts_as_the_server_did() -> None:
    """Evolved by its own decisions, the stock arm's preemptions free the KV its loop holds,
    and their victims queue again: it admits every request when the server did."""
    loop = run_closed_loop(TRACES / PREEMPT, ["stock"])
    check = loop.self_check
    assert check.requests == 40 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert check.wait_error_p50 <= 0.02 and check.wait_error_p90 <= 0.05, check  # the matrix's bounds
    assert loop.arms["stock"].exceptions == 0


def test_the_closed_loop_forks_each_checkpoints_mamba_state_as_the_server_did() -> None:
    """Under no_buffer each prefill or chunk that lands forks its state into a slot of the tree's
    (a running request holds two). Without the fork the loop kept slots free the server had not,
    admitted early and queued one more (wait error p90 125%, queue peak 7 for 6); with it, exact."""
    check = run_closed_loop(RETRACT_THEN_PREEMPT, ["stock"]).self_check
    assert check.requests == 34 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check
    assert check.loop_queue_peak == check.recorded_queue_peak == 6, check


TRACE_DIR = RETRACT_THEN_PREEMPT.parent


@pytest.mark.parametrize("name", ["mamba-priority-evicted-fork", "mamba-priority-abort-after-preempt"])
def test_the_closed_loop_reproduces_mamba_priority_recordings_exactly(name: str) -> None:
    """Each needs one more of the loop's rules (tests/traces/README.md): the fork; a requeued
    request's match lowered to the recorded one; a loop retraction's queue entry ranking the next
    preemption; a request aborted from the queue after it ran not finished at its recorded output."""
    check = run_closed_loop(TRACE_DIR / f"{name}.trace", ["stock"]).self_check
    assert check.requests >= 25 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check
    assert check.loop_queue_peak == check.recorded_queue_peak, check


def test_the_closed_loop_reproduces_a_dfs_weight_recording_exactly() -> None:
    """Needs an arm's own branch ages (by prefill, not arrival: 15.4% p90 without) and the extra
    decode of a client-aborted request under overlap (10.2% without): tests/traces/README.md."""
    check = run_closed_loop(TRACE_DIR / "dfs-weight-branch-order.trace", ["stock"]).self_check
    assert check.requests >= 35 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check
    assert check.loop_queue_peak == check.recorded_queue_peak, check
