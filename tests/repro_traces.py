"""Reproduction traces, one per scheduler bug, built with the project's trace writer.

Each builder writes a small, cleanly closed trace whose passes hold a
realistic scheduler state (the sandbox's shape: 40k-token KV, 8192-token
chunks, 12 running requests) and whose recorded outputs are what stock
sglang 0.5.23 decided on it, so the stock arm replays them with full fidelity.
"""

from __future__ import annotations

from pathlib import Path

from tracer.format import write_trace
from tracer.schema import (
    Admitted,
    Aiter,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    Header,
    KvSnapshot,
    Pass,
    RunningReq,
    ServerArgs,
    WaitingReq,
)

CHUNK = 8192


def header(policy: str = "fcfs", sglang_version: str | None = None) -> Header:
    from replay.patching import sglang_version as installed

    return Header(
        schema_version=1,
        sglang_version=sglang_version or installed(),
        schedtrace_version="0.1.0",
        host="repro",
        pid=1,
        tp_rank=0,
        dp_rank=None,
        start_wall_ns=0,
        server_args=ServerArgs(
            schedule_policy=policy,
            chunked_prefill_size=CHUNK,
            max_prefill_tokens=16384,
            page_size=1,
            max_running_requests=12,
            max_total_tokens=40000,
            attention_backend="torch_native",
            model_path="tiny-llama",
        ),
        max_req_slots=13,
    )


def running(n: int, input_len: int = 3000, output_len: int = 100) -> list[RunningReq]:
    return [RunningReq(f"run-{k}", input_len, output_len, 300, True) for k in range(n)]


def make_pass(seq: int, **fields) -> Pass:
    base = dict(
        seq=seq, t_ns=seq * 1_000_000, dur_ns=100_000, repeat=1, idle_before=0,
        waiting=[], running=[], chunked=None, batch_is_full_in=False,
        kv=KvSnapshot(available=0, evictable=0), req_slots_free=1, new_token_ratio=0.4,
        chunked_prefill_size=CHUNK, candidates=[], admitted=[], chunk=None,
        new_chunked_rid=None, batch_is_full_out=False,
    )
    base.update(fields)
    return Pass(**base)


def chunk_cap_trace(path: Path) -> Path:
    """A continuing chunk with no free or evictable KV: stock asks for a full chunk anyway."""
    p = make_pass(
        0,
        running=running(11),
        chunked=ChunkedReq("long", 30000, 8192, 300, 0, True),
        kv=KvSnapshot(available=0, evictable=0),
        req_slots_free=1,
        chunk=ChunkOutcome("long", CHUNK, CHUNK),
        admitted=[Admitted("long", 8192, CHUNK)],
    )
    return write_trace(path, header(), [p])


def one_chunk_trace(path: Path) -> Path:
    """Default policy, a chunked request in flight and a second long request that would be chunked."""
    p = make_pass(
        0,
        running=running(4),
        waiting=[WaitingReq("second", 20000, 0, 300, 0, None, True)],
        chunked=ChunkedReq("first", 20000, 8192, 300, 0, True),
        kv=KvSnapshot(available=12000, evictable=0),
        req_slots_free=7,
        chunk=ChunkOutcome("first", 8192, 8192),
        admitted=[Admitted("first", 8192, 8192)],
    )
    return write_trace(path, header(), [p])


def latch_trace(path: Path, passes: int = 10) -> Path:
    """batch_is_full latched with requests running while KV and slots are free."""
    records = [
        make_pass(
            n,
            running=running(3),
            waiting=[WaitingReq("queued", 2000, 0, 300, 0, None, True)],
            batch_is_full_in=True,
            kv=KvSnapshot(available=30000, evictable=0),
            req_slots_free=10,
            batch_is_full_out=True,
        )
        for n in range(passes)
    ]
    return write_trace(path, header(), records)


def aiter_trace(path: Path) -> Path:
    """An over-capacity extend inside piecewise graph context, on the aiter backend."""
    records = [
        make_pass(
            0,
            waiting=[WaitingReq("big", 6000, 0, 300, 0, None, True)],
            kv=KvSnapshot(available=38000, evictable=0),
            req_slots_free=13,
            candidates=[Candidate("big", 0, 6000, "CONTINUE")],
            admitted=[Admitted("big", 0, 6000)],
        ),
        Aiter(
            t_ns=1_500_000, forward_mode="EXTEND", seq_lens_sum=6000, max_chunk_capacity=4096,
            in_piecewise_graph=True, in_breakable_graph=False, method="MHA", pass_seq=0,
        ),
    ]
    return write_trace(path, header(), records)
