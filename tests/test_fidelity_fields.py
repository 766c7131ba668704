"""The fidelity checker itself: every field it compares is caught when the recording disagrees.

Each case takes a real pass of a sample trace, changes one recorded output,
and replays it through the engine's own comparison with sglang's real pass:
the pass must be a mismatch naming exactly that field. Leaving a field out of
``differ.FIDELITY_FIELDS`` (or the order check) fails its case.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schedtrace.replay.differ import FIDELITY_FIELDS
from schedtrace.replay.engine import _Replayer
from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import ChunkOutcome, Pass

TRACE = Path(__file__).parent.parent / "traces" / "kv-pressure-lpm-24k.trace"


def _passes() -> tuple[object, list[Pass]]:
    with TraceReader(TRACE) as reader:
        return reader.header, list(reader.passes())


def _changed(p: Pass, field: str) -> Pass:
    replace = msgspec.structs.replace
    if field == "admitted":
        return replace(p, admitted=p.admitted[:-1] if p.admitted else [*p.admitted])
    if field == "chunk_budget":
        return replace(p, chunk=ChunkOutcome(p.chunk.rid, (p.chunk.budget or 0) + 1, p.chunk.size))
    if field == "chunk_size":
        return replace(p, chunk=ChunkOutcome(p.chunk.rid, p.chunk.budget, None if p.chunk.size else 1))
    if field == "new_chunked_rid":
        return replace(p, new_chunked_rid=None if p.new_chunked_rid else "someone-else")
    if field == "batch_is_full":
        return replace(p, batch_is_full_out=not p.batch_is_full_out)
    if field == "error":
        return replace(p, error="ValueError: not what the pass did")
    if field == "queue_order":
        return replace(p, order=[1, len(p.waiting) - 1, 0, 1])
    raise AssertionError(field)


def _pick(passes: list[Pass], field: str) -> Pass:
    if field == "admitted":
        return next(p for p in passes if p.admitted)
    if field in ("chunk_budget", "chunk_size"):
        return next(p for p in passes if p.chunk is not None and p.chunk.budget is not None)
    if field == "queue_order":
        return next(p for p in passes if len(p.waiting) >= 2 and p.order is None)
    return passes[len(passes) // 2]


@pytest.mark.parametrize("field", [*FIDELITY_FIELDS, "queue_order"])
def test_a_recorded_field_the_replay_disagrees_with_is_a_mismatch(field: str) -> None:
    header, passes = _passes()
    if field == "queue_order":  # the order check runs on traces that record it
        header = msgspec.structs.replace(header, prefix_block=16)
    replayer = _Replayer(PassDriver(header), "stock", "fixed")
    original = _pick(passes, field)
    replayer.on_pass(original)
    assert not replayer.chunk.mismatches  # the real pass reproduces the recording as it is
    replayer.on_pass(_changed(original, field))
    (mismatch,) = replayer.chunk.mismatches
    assert mismatch.fields == [field]
