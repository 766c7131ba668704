"""The hybrid sandboxes under overload: real hybrid pools, chunked prefill, traces that say so.

``mamba_sandbox`` (tiny Kimi-Linear, real forward) and ``swa_sandbox``
(tiny gpt-oss, forward stood in for) each get a burst of concurrent requests
(bounded count and time, loopback only) that overflows their pools: one
prompt longer than a chunk, a shared prefix, more requests than running
slots, and for the mamba model a state pool that caps running requests by
itself. What the scheduler did is read back from the recorder's traces.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import VOCAB_SIZE, generate, random_input_ids

from schedtrace.tracer.analysis.summary import summarize
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Finish, Header, Pass
from schedtrace.tracer.sandbox.assets.make_tiny_model import EOS_ID
from schedtrace.tracer.sandbox.server import SandboxServer
from schedtrace.tracer.sandbox.standins.forward import STOP_ONE_IN, next_tokens, stand_in_completion

REQUESTS = 16  # twice the 8 running slots each hybrid overload allows
MAX_NEW_TOKENS = 16
SHARED_PREFIX = 256  # tokens the even-numbered requests share
LONG_PROMPT = 2600  # longer than two 1k chunks
CHUNK = 1024  # --chunked-prefill-size in both models' overload_args
FINISH_WAIT_S = 30.0  # the writer thread flushes every ~50 ms

MAMBA_CAP = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache \(max_mamba_cache_size=(\d+)")
SWA_POOL = re.compile(r"swa size: (\d+), full size: (\d+)")


def prompt_of(rid: str, input_len: int, shared: list[int] | None) -> list[int]:
    """The ids ``generate`` sends for ``rid`` (its random prompt, the shared prefix first)."""
    ids = random_input_ids(input_len, rid)
    if shared:
        ids[: len(shared)] = shared
    return ids


def overload(server: SandboxServer, prefix: str) -> dict[str, tuple[list[int], dict]]:
    """``REQUESTS`` concurrent requests: rid -> (prompt ids, reply). ~18k prompt tokens in all."""
    shared = random_input_ids(SHARED_PREFIX, f"{prefix}-shared")
    lengths = [LONG_PROMPT] + [400 + 90 * i for i in range(REQUESTS - 1)]

    def one(i: int) -> tuple[str, tuple[list[int], dict]]:
        rid = f"{prefix}-{i}"
        prefix_ids = shared if i % 2 == 0 else None
        reply = generate(server, rid, lengths[i], MAX_NEW_TOKENS, ignore_eos=False, prefix_ids=prefix_ids,
                         timeout_s=300.0)
        return rid, (prompt_of(rid, lengths[i], prefix_ids), reply)

    with ThreadPoolExecutor(REQUESTS) as pool:
        return dict(pool.map(one, range(REQUESTS)))


def one_trace(trace_dir: Path) -> Path:
    """The one trace a single-rank server writes into ``trace_dir``."""
    (path,) = sorted(trace_dir.glob("*.trace"))
    return path


def traced(trace_dir: Path, rids: set[str]) -> tuple[Header, list]:
    """The header and records of the one trace, once every rid's finish is in it."""
    deadline = time.monotonic() + FINISH_WAIT_S
    while True:
        with TraceReader(one_trace(trace_dir)) as reader:
            header, records = reader.header, [r for _, r in reader.records()]
        finished = {r.rid for r in records if isinstance(r, Finish)}
        if rids <= finished or time.monotonic() > deadline:
            assert rids <= finished, f"no finish record for {sorted(rids - finished)}"
            return header, records
        time.sleep(0.2)


def assert_all_completed(results: dict[str, tuple[list[int], dict]]) -> None:
    assert len(results) == REQUESTS
    for rid, (prompt, reply) in results.items():
        meta = reply["meta_info"]
        assert meta["id"] == rid
        assert meta["prompt_tokens"] == len(prompt)
        assert 1 <= meta["completion_tokens"] <= MAX_NEW_TOKENS
        assert meta["finish_reason"]["type"] in ("length", "stop"), meta["finish_reason"]


def ran_chunked_prefill(passes: list[Pass]) -> bool:
    return any(p.chunk is not None and p.chunk.size for p in passes) and any(p.new_chunked_rid for p in passes)


def occupancy(p: Pass) -> int:
    """Requests holding a running slot once the pass has admitted."""
    return len(p.running) + len(p.admitted)


def test_mamba_hybrid_overload_hits_the_state_pool_cap(mamba_sandbox: SandboxServer) -> None:
    results = overload(mamba_sandbox, "mamba-overload")
    assert_all_completed(results)

    header, records = traced(mamba_sandbox.trace_dir, set(results))
    passes = [r for r in records if isinstance(r, Pass) and any(w.rid in results for w in r.waiting)]
    assert header.is_hybrid_mamba and not header.is_hybrid_swa
    assert ran_chunked_prefill(passes)
    assert max(p.chunk.size for p in passes if p.chunk is not None and p.chunk.size) <= CHUNK

    # sglang sized the request pool from the state pool, and that cap bound admission.
    cap, slots = map(int, MAMBA_CAP.search(mamba_sandbox.log_path.read_text()).groups())
    assert header.max_req_slots == cap < REQUESTS
    # The header holds the cap the scheduler derived, not the flag (the sandbox leaves it unset).
    assert header.server_args.max_running_requests == cap
    assert max(occupancy(p) for p in passes) == cap
    assert any(occupancy(p) == cap and len(p.waiting) > len(p.admitted) for p in passes)

    # Recorded pool counts stay within their pools, and the state pool was in use.
    max_total = header.server_args.max_total_tokens
    assert all(0 <= p.kv.available <= max_total and p.kv.evictable >= 0 for p in passes)
    mamba_free = [p.kv.mamba_available for p in passes]
    assert all(free is not None and 0 <= free <= slots for free in mamba_free)
    assert min(mamba_free) < slots

    # What `schedtrace info` prints reads this trace too.
    with TraceReader(one_trace(mamba_sandbox.trace_dir)) as reader:
        summary = summarize(reader)
    assert summary["header"]["is_hybrid_mamba"] and summary["requests"] >= REQUESTS


def test_swa_hybrid_overload_decodes_the_stand_in_tokens_to_eos(swa_sandbox: SandboxServer) -> None:
    results = overload(swa_sandbox, "swa-overload")
    assert_all_completed(results)
    # The forward stand-in's tokens came through the real sampler and stop check:
    # each request got exactly its predicted ids, EOS included where it came early.
    for rid, (prompt, reply) in results.items():
        assert reply["output_ids"] == stand_in_completion(prompt, MAX_NEW_TOKENS, VOCAB_SIZE, EOS_ID), rid
    reasons = {reply["meta_info"]["finish_reason"]["type"] for _, reply in results.values()}
    assert reasons == {"length", "stop"}  # some stopped at EOS, some ran to max_new_tokens

    header, records = traced(swa_sandbox.trace_dir, set(results))
    passes = [r for r in records if isinstance(r, Pass) and any(w.rid in results for w in r.waiting)]
    assert header.is_hybrid_swa and not header.is_hybrid_mamba
    assert ran_chunked_prefill(passes)
    assert max(occupancy(p) for p in passes) <= header.max_req_slots

    swa_size, full_size = map(int, SWA_POOL.search(swa_sandbox.log_path.read_text()).groups())
    assert header.server_args.max_total_tokens == full_size == header.pools.full_size
    assert all(0 <= p.kv.available <= full_size for p in passes)
    swa_free = [p.kv.swa_available for p in passes]
    assert all(free is not None and 0 <= free <= swa_size for free in swa_free)
    assert min(swa_free) < swa_size
    finishes = {r.rid: r for r in records if isinstance(r, Finish) and r.rid in results}
    assert {rid: f.reason for rid, f in finishes.items()} == {
        rid: reply["meta_info"]["finish_reason"]["type"] for rid, (_, reply) in results.items()
    }


def test_forward_stand_in_is_deterministic_and_stops_about_one_step_in_stop_one_in() -> None:
    import torch

    last = torch.arange(3, 3 + 4000) % VOCAB_SIZE
    lengths = torch.arange(4000) * 7 + 11
    tokens = next_tokens(last, lengths, VOCAB_SIZE, EOS_ID)
    assert torch.equal(tokens, next_tokens(last, lengths, VOCAB_SIZE, EOS_ID))
    words = tokens[tokens != EOS_ID]
    assert int(words.min()) >= 3 and int(words.max()) < VOCAB_SIZE  # never a special token but EOS
    eos_share = float((tokens == EOS_ID).float().mean())
    assert 0.5 / STOP_ONE_IN < eos_share < 2.0 / STOP_ONE_IN
    assert not (next_tokens(last, lengths, VOCAB_SIZE, None) == EOS_ID).any()  # no EOS id: never stops
    # A completion ends at its first EOS, or at max_new_tokens.
    completion = stand_in_completion([5, 6, 7], 400, VOCAB_SIZE, EOS_ID)
    assert completion.count(EOS_ID) <= 1 and (completion[-1] == EOS_ID or len(completion) == 400)
