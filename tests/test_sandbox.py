"""The embedded CPU sandbox: the real sglang server starts, serves, and stops cleanly."""

from __future__ import annotations

import re
import threading

import pytest
from conftest import generate, log_size

from schedtrace.tracer.sandbox.server import SandboxServer, group_members, pid_alive, process_group_alive

PREFILL_LINE = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")
CHUNK = 8192  # --chunked-prefill-size in KV_PRESSURE_ARGS


@pytest.mark.own_server
def test_default_server_starts_serves_and_stops_every_process(tmp_path):
    server = SandboxServer(log_path=tmp_path / "server.log")
    with server:
        pgid = server.pid
        members = group_members(pgid)
        # launcher + scheduler + detokenizer at least, all in the server's own group
        assert len(members) >= 3, members
        out = generate(server, rid="own-1", input_len=50, max_new_tokens=4)
        assert out["meta_info"]["id"] == "own-1"
        assert out["meta_info"]["completion_tokens"] == 4
    assert not process_group_alive(pgid)
    assert [pid for pid in members if pid_alive(pid)] == []
    assert not server.running
    server.stop()  # idempotent


def test_serves_concurrent_requests_with_chunked_prefill(sandbox):
    log_start = log_size(sandbox.log_path)
    # One prompt longer than a chunk forces chunked prefill; the rest together
    # (~70k tokens) overflow the 40k-token KV pool.
    lengths = [10_000] + [1500 + 125 * i for i in range(23)]
    results: dict[str, dict] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(lengths))

    def one(i: int, input_len: int) -> None:
        rid = f"sandbox-concurrent-{i}"
        try:
            barrier.wait()
            results[rid] = generate(sandbox, rid, input_len, max_new_tokens=8)
        except BaseException as exc:  # surfaced below with its rid
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i, n)) for i, n in enumerate(lengths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert len(results) == len(lengths)
    for i, input_len in enumerate(lengths):
        meta = results[f"sandbox-concurrent-{i}"]["meta_info"]
        assert meta["id"] == f"sandbox-concurrent-{i}"
        assert meta["prompt_tokens"] == input_len
        assert meta["completion_tokens"] == 8

    with open(sandbox.log_path, "rb") as f:
        f.seek(log_start)
        log = f.read().decode("utf-8", "replace")
    prefills = [(int(s), int(t)) for s, t in PREFILL_LINE.findall(log)]
    assert prefills, "the scheduler logged no prefill batch"
    assert max(tokens for _, tokens in prefills) == CHUNK  # a full chunk, never more
    assert max(seqs for seqs, _ in prefills) > 1  # several queued prompts admitted together
