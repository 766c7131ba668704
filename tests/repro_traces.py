"""Reproduction traces, one per scheduler bug, built with the project's trace writer.

Each builder writes a small, cleanly closed trace whose passes hold a
realistic scheduler state (the sandbox's shape: 40k-token KV, 8192-token
chunks, 12 running requests) and whose recorded outputs are what stock
sglang 0.5.23 decided on it, so the stock arm replays them with full fidelity.
``latch_diff`` writes the latch fix alone as a user's diff.
"""

from __future__ import annotations

import re
from pathlib import Path

from schedtrace.arms.shipped import BUILTIN_DIFF_PATH
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.schema import (
    Admitted,
    Aiter,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    Header,
    KvSnapshot,
    Pass,
    RunningReq,
    WaitingReq,
)

CHUNK = 8192


def header(
    policy: str = "fcfs",
    sglang_version: str | None = None,
    *,
    chunked_prefill_size: int = CHUNK,
    disable_radix_cache: bool = False,
    mamba_chunk_grid: int = 1,
) -> Header:
    from schedtrace.arms.patching import sglang_version as installed

    return builders.header(
        sglang_version=sglang_version or installed(),
        host="repro",
        server_args=builders.server_args(
            schedule_policy=policy,
            chunked_prefill_size=chunked_prefill_size,
            disable_radix_cache=disable_radix_cache,
        ),
        mamba_chunk_grid=mamba_chunk_grid,
    )


def running(n: int, input_len: int = 3000, output_len: int = 100) -> list[RunningReq]:
    return [RunningReq(f"run-{k}", input_len, output_len, 300, True) for k in range(n)]


make_pass = builders.pass_record


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


# The one-chunk route: sglang's mamba_prefill_chunk_grid() is 64 (DCP + mamba
# extra buffer, the Kimi-K3 case), so a continuing chunk cut at the 1000-token
# budget is floored to 960 and leaves 40 tokens of chunk budget with KV to spare.
GRID = 64
SMALL_CHUNK = 1000
GRID_CHUNK = SMALL_CHUNK // GRID * GRID  # 960
LEFTOVER = SMALL_CHUNK - GRID_CHUNK  # 40


def _one_chunk_pass(*, ignore_eos: bool, admitted_second: bool, error: str | None) -> Pass:
    admitted = [Admitted("first", 2000, GRID_CHUNK)]
    candidates = []
    if admitted_second:
        admitted.append(Admitted("second", 0, LEFTOVER))
        candidates.append(Candidate("second", 0, LEFTOVER, "CONTINUE"))
    else:
        candidates.append(Candidate("second", 0, 0, "OTHER"))
    return make_pass(
        0,
        running=running(2),
        waiting=[WaitingReq("second", 5000, 0, 300, 0, None, ignore_eos)],
        chunked=ChunkedReq("first", 6000, 2000, 300, 0, True),
        kv=KvSnapshot(available=35000, evictable=0),
        req_slots_free=10,
        chunked_prefill_size=SMALL_CHUNK,
        candidates=candidates,
        admitted=admitted,
        chunk=ChunkOutcome("first", SMALL_CHUNK, GRID_CHUNK),
        error=error,
    )


def one_chunk_trace(path: Path) -> Path:
    """The grid leaves chunk budget and the second long request is chunked: the assert fires.

    Reachable on one KV pool only through ``PrefillAdder.add_one_req_ignore_eos``
    (radix cache off, ``ignore_eos``): that path chunks with the grid floor alone,
    while ``_select_prefill_admission`` also floors to the scheduler's truncation
    alignment (= the grid), which empties a sub-grid leftover.
    """
    p = _one_chunk_pass(ignore_eos=True, admitted_second=True, error="AssertionError: ")
    hdr = header(chunked_prefill_size=SMALL_CHUNK, disable_radix_cache=True, mamba_chunk_grid=GRID)
    return write_trace(path, hdr, [p])


def one_chunk_radix_trace(path: Path) -> Path:
    """The same state with the radix cache on: truncation alignment floors the
    40-token leftover to 0, so the second request waits and nothing raises."""
    p = _one_chunk_pass(ignore_eos=False, admitted_second=False, error=None)
    return write_trace(path, header(chunked_prefill_size=SMALL_CHUNK, mamba_chunk_grid=GRID), [p])


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


# What the live variant of the diff logs each time its changed line runs.
LIVE_MARKER = "schedtrace-live-arm: batch_is_full re-evaluated"


def latch_diff(path: Path, *, marker: bool = False) -> Path:
    """The latch fix alone, as its diff section of builtin-fixes.diff (``marker``: plus a log line
    ``LIVE_MARKER``, to see it run in a live server), written to ``path``."""
    sections = re.split(r"(?=^diff --git )", BUILTIN_DIFF_PATH.read_text(), flags=re.M)
    text = next(s for s in sections if s.startswith("diff --git") and "managers/scheduler.py" in s.splitlines()[0])
    if marker:
        new = "+        running_batch.batch_is_full = False\n"
        assert text.count(new) == 1
        text = text.replace(new, new + f'+        logger.warning("{LIVE_MARKER}")\n')
        head = re.search(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@", text)
        text = text.replace(head.group(0), f"@@ -{head[1]},{head[2]} +{head[3]},{int(head[4]) + 1} @@")
    path.write_text(text)
    return path
