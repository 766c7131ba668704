"""Dynamic chunking and pipeline stages: recorded, replayed with sglang's own sizer, and looped over
the pipeline's micro-batches.

``tests/traces/dynamic-chunking-pp0.trace`` is the first stage's trace of the policy matrix's
``dynamic-chunking`` configuration (``--pp-size 2 --enable-dynamic-chunking``, lpm, 4 running).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schedtrace.replay.driver import PassDriver
from schedtrace.replay.engine import replay_trace
from schedtrace.replay.loop.arm_tree import ArmTree
from schedtrace.replay.loop.chunk_sizer import SMOOTH_FACTOR, ChunkSizes
from schedtrace.replay.loop.micro_batches import MicroBatch, rotate
from schedtrace.replay.loop.run import closed_loop_report, load_input, run_arms, scan_trace
from schedtrace.replay.loop.state import LoopReq, LoopState
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import SGLANG_RADIX_FORCE_MISS
from schedtrace.tracer.contract.schema import Arrival, Finish, Pass, Retract

TRACE = Path(__file__).parent / "traces" / "dynamic-chunking-pp0.trace"


@pytest.fixture(scope="module")
def recorded():
    with TraceReader(TRACE) as reader:
        return reader.header, list(reader.passes())


def test_the_recorder_wrote_the_sizers_fit_and_its_smoothing(recorded) -> None:
    header, passes = recorded
    assert header.pp_size == 2 and header.chunk_sizer is not None
    assert header.chunk_sizer.quadratic > 0 and header.chunk_sizer.target_latency_ms > 0
    assert header.settings[SMOOTH_FACTOR] == 0.75
    static = header.server_args.chunked_prefill_size
    sized = [p.chunked_prefill_size for p in passes if p.chunked is not None]
    assert len(sized) >= 5 and any(size != static for size in sized)  # the sizer really sized chunks


def test_sglangs_predictor_rebuilt_from_the_header_gives_every_recorded_size(recorded) -> None:
    header, passes = recorded
    sizes = ChunkSizes(header, static_size=None)
    assert sizes.dynamic
    for p in passes:
        assert sizes.size(p.chunked) == p.chunked_prefill_size, p.seq


def test_the_recorded_smoothing_factor_is_the_one_applied(recorded) -> None:
    header, passes = recorded
    other = msgspec.structs.replace(header, settings={**header.settings, SMOOTH_FACTOR: 1.0})
    sizes = ChunkSizes(other, static_size=None)
    assert any(sizes.size(p.chunked) != p.chunked_prefill_size for p in passes if p.chunked is not None)


def test_without_a_fit_the_loop_keeps_the_start_size(recorded) -> None:
    header, passes = recorded
    sizes = ChunkSizes(msgspec.structs.replace(header, chunk_sizer=None), static_size=1024)
    assert not sizes.dynamic
    assert {sizes.size(p.chunked) for p in passes} == {1024}


def test_a_micro_batch_holds_the_running_cap_over_the_stages(recorded) -> None:
    header, _ = recorded
    assert capacity.max_running(header) == 4
    assert capacity.micro_batch_cap(header) == 2  # sglang's pp_max_micro_batch_size default
    given = msgspec.structs.replace(header, settings={**header.settings, "pp_max_micro_batch_size": 3})
    assert capacity.micro_batch_cap(given) == 3
    one_stage = msgspec.structs.replace(header, pp_size=1)
    assert capacity.micro_batch_cap(one_stage) == 4


def test_a_pipeline_stages_trace_replays_every_decision_and_queue_order() -> None:
    """With 4 running over 2 stages each micro-batch holds 2: replayed at 4, 40 of 468 passes
    admitted what the server could not."""
    fid = replay_trace(TRACE, "stock", "fixed").fidelity
    assert fid.total > 400
    assert (fid.matched, fid.order_matched) == (fid.total, fid.order_total), fid.mismatches[:3]


def _self_check(from_pass: int, micro_batches: bool = True, trace: Path = TRACE):
    with TraceReader(trace) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, from_pass, scan)
    if not micro_batches:
        loop.initial.parked = []  # one running batch, as without the pipeline
    return loop, closed_loop_report(loop, scan, run_arms(None, ["stock"], loop=loop)).self_check


def test_the_closed_loop_takes_the_micro_batches_in_turn() -> None:
    """Each pass decides for one of the two micro-batches, and a micro-batch's finishes free KV one
    pass later: the stock loop then admits every request when the server did. With one running
    batch it drifts (9.5% median, 39% p90 here)."""
    loop, check = _self_check(0)
    assert len(loop.initial.parked) == 1  # pp_size 2, no async depth: two micro-batches
    assert check.requests > 30 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90, check.order_agreement) == (0, 0, 1), check
    assert check.loop_queue_peak == check.recorded_queue_peak
    _, single = _self_check(0, micro_batches=False)
    assert single.wait_error_p90 > 0.05, single


def test_a_loop_from_mid_trace_starts_with_the_other_micro_batchs_running_requests() -> None:
    """The other micro-batch's requests are those the next pass records running: they hold KV the
    start's free count already left out, and finish in their own turns."""
    loop, check = _self_check(101)
    (other,) = loop.initial.parked
    assert other.running and not {r.rid for r in other.running} & {r.rid for r in loop.initial.running}
    assert check.requests > 20 and (check.wait_error_p50, check.wait_error_p90) == (0, 0), check


def test_a_loop_from_mid_trace_keeps_the_other_micro_batchs_latch() -> None:
    """At pass 151 the other micro-batch's batch was full (latched) with a slot free: without its
    recorded latch the loop admitted there and drifted (6.5% median, 23% p90)."""
    loop, check = _self_check(150)
    (other,) = loop.initial.parked
    assert other.batch_is_full and other.running
    assert check.requests > 20 and (check.wait_error_p50, check.wait_error_p90) == (0, 0), check


def test_a_state_is_rotated_to_the_next_micro_batch(recorded) -> None:
    header = msgspec.structs.replace(recorded[0], settings={"pp_async_batch_depth": 1})
    assert capacity.micro_batches(header) == 3 and capacity.micro_batches(msgspec.structs.replace(header, pp_size=1)) == 1
    a, b = LoopReq("a", 8, 4, 4), LoopReq("b", 8, 4, 4)
    state = LoopState([], [a], None, True, 100, 0, 4, parked=[MicroBatch([b]), MicroBatch()])
    rotate(state)
    assert (state.running, state.batch_is_full) == ([b], False)
    assert [(mb.running, mb.batch_is_full) for mb in state.parked] == [([], False), ([a], True)]
    assert state.held() == [b, a] and not state.is_empty


# A matrix recording (clean-clone make test at 8a0e4ff) whose server ran with SGLANG_RADIX_FORCE_MISS=1:
# a test's monkeypatched setting had reached the server recording beside it (tests/traces/README.md).
FORCE_MISS = Path(__file__).parent / "traces" / "dynamic-chunking-force-miss-pp0.trace"


def _decisions(header) -> list:
    with TraceReader(FORCE_MISS) as reader:
        driver = PassDriver(header)
        out = []
        for _, record in reader.records():
            if isinstance(record, Pass):
                out.append(driver.decide(replay_inputs(record), "stock"))
            elif isinstance(record, (Arrival, Finish, Retract)):
                driver.note(record)
    return out


def test_a_server_that_forced_every_prefix_miss_replays_under_its_recorded_setting() -> None:
    """Every match missed, the in-batch check's too, so the server admitted two of one family at pass 3;
    replayed as if the setting were off, sglang's check deprioritizes the second."""
    with TraceReader(FORCE_MISS) as reader:
        header = reader.header
    assert header.settings[SGLANG_RADIX_FORCE_MISS] is True
    fid = replay_trace(FORCE_MISS, "stock", "fixed", jobs=1).fidelity
    assert fid.total > 500 and (fid.matched, fid.order_matched) == (fid.total, fid.order_total), fid.mismatches[:1]
    as_recorded = _decisions(header)
    without = _decisions(msgspec.structs.replace(header, settings={**header.settings, SGLANG_RADIX_FORCE_MISS: False}))
    differ = [seq for seq, (a, b) in enumerate(zip(as_recorded, without)) if a.admitted != b.admitted]
    assert differ and differ[0] == 3, differ[:3]


def test_the_closed_loop_of_a_forced_miss_server_matches_nothing() -> None:
    """Its arms keep no tree of their own (every match misses), and the stock loop is exact."""
    with TraceReader(FORCE_MISS) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, 0, scan)
    assert not ArmTree.applies(loop)
    check = closed_loop_report(loop, scan, run_arms(None, ["stock"], loop=loop)).self_check
    assert check.requests > 30 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90, check.order_agreement) == (0, 0, 1), check


# A matrix recording (here, 4th of 4 at a40fc8b) where a micro-batch's latch cleared after it chunked:
# CI's recording of that kind drifted 0.4% / 11.7% (p50 / p90), this one 3.7% / 18%.
CHUNK_LATCH = Path(__file__).parent / "traces" / "dynamic-chunking-chunk-latch-pp0.trace"


def _latches(trace: Path) -> tuple[dict[int, bool], dict[int, bool]]:
    """Each scheduler pass's batch_is_full at entry: recorded, and in the stock loop from pass 0."""
    with TraceReader(trace) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, 0, scan)
        recorded = {scan.iteration_of(p.seq): p.batch_is_full_in for p in reader.passes()}
    run = run_arms(None, ["stock"], loop=loop)["stock"]
    looped = {p.seq - loop.from_pass + loop.start_iteration: p.batch_is_full_in for p in run.passes}
    return recorded, looped


@pytest.mark.parametrize("trace", [CHUNK_LATCH, TRACE, FORCE_MISS], ids=lambda t: t.stem)
def test_the_loop_clears_a_micro_batchs_latch_where_the_server_did(trace: Path) -> None:
    """Two clears of ``get_next_batch_to_run``: a batch whose last batch held a chunk it left
    unfinished shrinks as that chunk is filtered out (49 passes of CHUNK_LATCH kept the latch without
    it), and a prefill into an empty batch becomes the running batch with its own latch, never set
    (3 or 4 passes of each trace)."""
    recorded, looped = _latches(trace)
    both = set(recorded) & set(looped)
    assert len(both) > 400
    assert [i for i in sorted(both) if recorded[i] != looped[i]] == []
    assert any(recorded[i] != recorded.get(i - 2, recorded[i]) for i in both)  # the latch moved


def test_a_micro_batch_that_chunked_admits_when_the_server_did() -> None:
    _, check = _self_check(0, trace=CHUNK_LATCH)
    assert check.requests > 30 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0, 0), check
    assert check.loop_queue_peak == check.recorded_queue_peak


def test_a_loop_from_mid_trace_finishes_what_the_other_micro_batch_decoded_to_its_end() -> None:
    """At pass 52 the other micro-batch's last turn decoded ``w0f0m1`` to its end: it is in no pass's
    running batch, but holds its KV and slot until the loop processes that turn (88% p90 without)."""
    loop, check = _self_check(52)
    (other,) = loop.initial.parked
    ending = [r for r in other.running if r.output_len >= r.target_output]
    assert [r.rid[-6:] for r in ending] == ["w0f0m1"]
    assert check.requests > 20 and (check.wait_error_p50, check.wait_error_p90) == (0, 0), check


def test_a_loop_from_mid_trace_lands_the_other_micro_batchs_prefill_when_it_is_processed() -> None:
    """At pass 221 the other micro-batch has just prefilled ``w1f1m0``: its family's prompt is not in
    the tree until the loop processes that result, so its siblings match nothing yet (27% p90 without)."""
    loop, check = _self_check(221, trace=CHUNK_LATCH)
    (other,) = loop.initial.parked
    assert [r.rid[-6:] for r in other.running if r.tree_landing] == ["w1f1m0"]
    assert check.requests > 15 and (check.wait_error_p50, check.wait_error_p90) == (0, 0), check
