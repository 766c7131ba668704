"""A closed loop's state as the ``Pass`` record the driver decides on, and back.

Pure: no sglang, no I/O. ``to_pass`` writes a ``LoopState`` as a pass's
inputs (what the real scheduler would see at that pass's entry: under
overlap scheduling, each running request's processed outputs only);
``with_outputs`` fills in what the driver decided, for reading back (the
stall rule, bisect).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from schedtrace.replay.loop.pools import FULL_POOL, LoopPools
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import (
    Admitted,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    KvSnapshot,
    Pass,
    RunningReq,
    WaitingReq,
)

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopState


def to_pass(
    state: LoopState,
    *,
    seq: int,
    t_ns: int,
    new_token_ratio: float,
    chunked_prefill_size: int | None,
    pools: LoopPools = FULL_POOL,
    processed_tokens: int | None = None,
) -> Pass:
    """The synthetic pass record of ``state`` (inputs only; outputs empty)."""
    chunked = state.chunked
    swa_free, swa_evictable = state.swa_free, state.swa_evictable
    if pools.swa_ring_cost:  # a ring per request slot: what SWATokenToKVPoolAllocator reports
        swa_free, swa_evictable = state.req_slots_free * pools.swa_ring_cost, 0
    return Pass(
        seq=seq,
        t_ns=t_ns,
        dur_ns=0,
        repeat=1,
        idle_before=0,
        waiting=[
            WaitingReq(
                rid=r.rid,
                input_len=r.input_len,
                output_len=r.output_len,
                max_new_tokens=r.max_new_tokens,
                prefix_len=r.prefix_len,
                priority=r.priority,
                ignore_eos=r.ignore_eos,
            )
            for r in state.waiting
        ],
        running=[
            RunningReq(
                rid=r.rid,
                input_len=r.input_len,
                output_len=r.output_len - r.inflight,  # what the scheduler has processed
                max_new_tokens=r.max_new_tokens,
                ignore_eos=r.ignore_eos,
            )
            for r in state.running
        ],
        chunked=(
            ChunkedReq(
                rid=chunked.rid,
                input_len=chunked.input_len,
                prefix_len=chunked.prefix_len,
                max_new_tokens=chunked.max_new_tokens,
                output_len=chunked.output_len,
                ignore_eos=chunked.ignore_eos,
            )
            if chunked is not None
            else None
        ),
        batch_is_full_in=state.batch_is_full,
        kv=KvSnapshot(
            available=state.free,
            evictable=state.evictable,
            swa_available=swa_free,
            swa_evictable=swa_evictable,
            mamba_available=state.mamba_free,
            mamba_evictable=state.mamba_evictable,
        ),
        req_slots_free=state.req_slots_free,
        new_token_ratio=new_token_ratio,
        chunked_prefill_size=chunked_prefill_size,
        # Not the adder's verdicts: only what locking each match takes from the evictable count.
        candidates=[
            Candidate(rid=r.rid, prefix_len=r.prefix_len, extend_len=0, result="", locked_evictable=r.prefix_cached)
            for r in state.waiting
            if r.prefix_cached is not None
        ],
        admitted=[],
        chunk=None,
        new_chunked_rid=None,
        batch_is_full_out=state.batch_is_full,
        processed_tokens=processed_tokens,
    )


def with_outputs(p: Pass, decision: Decision, state_before: LoopState) -> Pass:
    """``p`` with its output fields filled from ``decision`` (for reading back)."""
    prefix = {r.rid: r.prefix_len for r in state_before.waiting}
    chunk = None
    if state_before.chunked is not None:
        chunk = ChunkOutcome(
            rid=state_before.chunked.rid, budget=decision.chunk_budget, size=decision.chunk_size
        )
    return replace_pass(
        p,
        admitted=[Admitted(rid=rid, prefix_len=prefix.get(rid, 0), extend_len=n) for rid, n in decision.admitted],
        chunk=chunk,
        new_chunked_rid=decision.new_chunked_rid,
        batch_is_full_out=decision.batch_is_full,
        error=decision.error,
    )


def replace_pass(p: Pass, **changes) -> Pass:
    return msgspec.structs.replace(p, **changes)
