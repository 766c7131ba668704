"""Reproduction traces for closed-loop replay and bisect (built with the project's writer).

Each holds a recorded starting state, arrival events for requests still to
come and finish events giving every request's output length.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.schema import Arrival, ChunkedReq, Finish, KvSnapshot, RunningReq, WaitingReq

from repro_traces import header, make_pass

MS = 1_000_000
LATCH_PASSES = 10  # recorded latched passes (an open-loop stall of 10)
FIRST_RUNNING_FINISH = 40  # decode steps until a running request leaves and stock unlatches


def latch_reproduction(path: Path) -> Path:
    """batch_is_full latched over a running batch, KV and slots free, requests queued and arriving.

    Stock sglang keeps the latch until a running request finishes, FIRST_RUNNING_FINISH
    passes later; the latch fix re-evaluates it on the first pass.
    """
    running = [RunningReq(f"run-{k}", 3000, 100, 100 + FIRST_RUNNING_FINISH + 10 * k, True) for k in range(3)]
    queued = WaitingReq("queued", 2000, 0, 20, 0, None, True)
    passes = [
        make_pass(
            n,
            t_ns=n * MS,
            running=[msgspec.structs.replace(r, output_len=r.output_len + n) for r in running],
            waiting=[queued],
            batch_is_full_in=True,
            kv=KvSnapshot(available=30000 - 3 * n, evictable=0),
            req_slots_free=10,
            batch_is_full_out=True,
        )
        for n in range(LATCH_PASSES)
    ]
    events = [
        Arrival(t_ns=0, rid="queued", input_len=2000, max_new_tokens=20, ignore_eos=True),
        Arrival(t_ns=5 * MS, rid="late-0", input_len=1500, max_new_tokens=10, ignore_eos=True),
        Arrival(t_ns=15 * MS, rid="late-1", input_len=2500, max_new_tokens=10, ignore_eos=True),
    ]
    finishes = [Finish(t_ns=500 * MS, rid=r.rid, output_len=r.max_new_tokens, reason="length") for r in running]
    finishes += [
        Finish(t_ns=600 * MS, rid="queued", output_len=20, reason="length"),
        Finish(t_ns=600 * MS, rid="late-0", output_len=10, reason="length"),
        Finish(t_ns=600 * MS, rid="late-1", output_len=10, reason="length"),
    ]
    return write_trace(path, header(), [events[0], *passes[:5], events[1], *passes[5:], events[2], *finishes])


GRID = 64  # the DCP mamba checkpoint grid (Header.mamba_chunk_grid)


def one_chunk_reproduction(path: Path, *, radix_cache: bool = False, late_arrival_ns: int | None = None) -> Path:
    """Default policy, a chunked request in flight, a second long request queued.

    With 1000-token chunks on the 64-token grid the continuing chunk is cut to
    960 and leaves 40 tokens of chunk budget. With the radix cache off and
    ``ignore_eos``, ``PrefillAdder.add_one_req_ignore_eos`` gives them to the
    second request as a new unfinished chunk: the scheduler's one-chunk
    assert. With the radix cache on, ``_select_prefill_admission`` floors the
    40 tokens to the grid, admits nothing more, and nothing raises.
    """
    hdr = header(chunked_prefill_size=1000, disable_radix_cache=not radix_cache, mamba_chunk_grid=GRID)
    p = make_pass(
        0,
        running=[RunningReq(f"run-{k}", 500, 10, 30, True) for k in range(2)],
        waiting=[WaitingReq("second", 3000, 0, 10, 0, None, True)],
        chunked=ChunkedReq("first", 3000, 1000, 10, 0, True),
        kv=KvSnapshot(available=30000, evictable=0),
        req_slots_free=9,
        chunked_prefill_size=1000,
    )
    events = [
        Arrival(t_ns=-1, rid="second", input_len=3000, max_new_tokens=10, ignore_eos=True),
        Arrival(t_ns=3 * MS, rid="third", input_len=800, max_new_tokens=10, ignore_eos=True),
        Finish(t_ns=90 * MS, rid="run-0", output_len=30, reason="length"),
        Finish(t_ns=90 * MS, rid="run-1", output_len=30, reason="length"),
        Finish(t_ns=90 * MS, rid="first", output_len=10, reason="length"),
        Finish(t_ns=90 * MS, rid="second", output_len=10, reason="length"),
        Finish(t_ns=90 * MS, rid="third", output_len=10, reason="length"),
    ]
    if late_arrival_ns is not None:  # one more request, long after the others
        events.append(Arrival(t_ns=late_arrival_ns, rid="late", input_len=100, max_new_tokens=10, ignore_eos=True))
        events.append(Finish(t_ns=late_arrival_ns + MS, rid="late", output_len=10, reason="length"))
    later = make_pass(1, t_ns=10 * MS, running=p.running, kv=p.kv, req_slots_free=9, chunked_prefill_size=1000)
    return write_trace(path, hdr, [p, *events[:2], later, *events[2:]])

