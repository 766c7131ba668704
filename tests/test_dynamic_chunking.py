"""Dynamic chunking and pipeline stages: recorded, and replayed with sglang's own sizer.

``tests/traces/dynamic-chunking-pp0.trace`` is the first stage's trace of the policy matrix's
``dynamic-chunking`` configuration (``--pp-size 2 --enable-dynamic-chunking``, lpm, 4 running).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schedtrace.replay.engine import replay_trace
from schedtrace.replay.loop.chunk_sizer import SMOOTH_FACTOR, ChunkSizes
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.format import TraceReader

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
