"""``schedtrace redrive``: record → export → redrive → record on the real sandbox, and the dead-server cases.

The round trip uses the shared ``sandbox`` (fcfs under KV pressure): a small
workload of prefix families, priorities and one client abort is sent, its
trace is cut to this test's requests, exported and re-driven through the
CLI, and the second recording must hold the same requests: input lengths,
prefix families (block for block, and cache hits where the first had them),
priorities and the abort.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import log_size

from otel_support import run_cli
from schedtrace.tracer.analysis.workload import Workload, WorkloadBuilder, WorkloadRequest
from schedtrace.testing import builders
from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.prefix_ids import PREFIX_BLOCK_TOKENS, id_count
from schedtrace.tracer.contract.schema import Arrival, Clock, Finish, Header, Pass
from schedtrace.tracer.sandbox.process import free_port, group_members, pid_alive, process_group_alive
from schedtrace.tracer.sandbox.redrive import input_ids, plan, redrive, server_vocab

BLOCK = PREFIX_BLOCK_TOKENS
FIRST, SECOND = "rd-first-", "rd-second-"
FLUSH_WAIT_S = 30.0


def synthetic_workload() -> Workload:
    """Two families of three (a 20-block prefix each), two loners, one long request the client drops."""
    next_id = 1_000_000  # far from the small ints a trace's export numbers from: no prompt repeats

    def ids(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    def req(t_ms: float, hash_ids: list[int], input_len: int, out: int, priority: int | None = None,
            abort_ms: float | None = None) -> WorkloadRequest:
        assert len(hash_ids) == id_count(input_len, BLOCK)
        return WorkloadRequest(t_ms=t_ms, input_len=input_len, output_len=out, hash_ids=hash_ids,
                               max_new_tokens=out, ignore_eos=True, priority=priority, finish_reason="length",
                               client_abort_ms=abort_ms)

    family = [ids(20), ids(20)]  # members 1.5 s apart: the one before is prefilled, its prefix in the tree
    # long: still running when dropped, and when sglang's 4 s disconnect poll sees the re-driven drop too
    requests = [req(0, ids(188), 3000, 8000, priority=1, abort_ms=1500)]
    for f, prefix in enumerate(family):
        for m in range(3):
            own = 5 + 3 * m
            requests.append(req(300 + 4500 * f + 1500 * m, prefix + ids(own), (20 + own) * BLOCK - 7, 6 + m,
                                priority=m))
    requests.append(req(9300, ids(63), 1000, 8))
    requests.append(req(9600, ids(7), 100, 4, priority=2))
    return Workload(block=BLOCK, shared_prefixes=True, requests=requests)


def recorded(trace_dir: Path, rid_prefix: str, count: int) -> tuple[Header, list, Workload, dict[str, int]]:
    """This test's records of the sandbox's trace, once every request has finished in it."""
    deadline = time.monotonic() + FLUSH_WAIT_S
    while True:
        (path,) = sorted(trace_dir.glob("*.trace"))
        with TraceReader(path) as reader:
            header = reader.header
            records = [(at, r) for at, r in reader.records()]
        mine = [(at, r) for at, r in records
                if isinstance(r, Clock) or getattr(r, "rid", "").startswith(rid_prefix)]
        finished = {r.rid for _, r in mine if isinstance(r, Finish)}
        if len(finished) >= count or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    builder = WorkloadBuilder(header.prefix_block)
    offset = header.start_wall_ns
    for at, r in mine:
        if isinstance(r, Clock):
            offset = r.wall_ns - r.t_ns
        else:
            builder.feed(str(path), at, r, offset + r.t_ns)
    hits: dict[str, int] = {}  # rid -> prefix tokens its admission reused
    for _, r in records:
        if isinstance(r, Pass):
            for a in r.admitted:
                if a.rid.startswith(rid_prefix):
                    hits.setdefault(a.rid, a.prefix_len)
    return header, [r for _, r in mine], builder.build(), hits


@pytest.fixture(scope="module")
def round_trip(sandbox, tmp_path_factory):
    folder = tmp_path_factory.mktemp("redrive")
    source = synthetic_workload()
    first = redrive(sandbox.url, plan(source, rid_prefix=FIRST), BLOCK, server_vocab(sandbox.url))
    header, mine, first_workload, first_hits = recorded(sandbox.trace_dir, FIRST, len(source.requests))

    # The first recording, cut to this test's requests: the trace a user would hand to redrive.
    cut = write_trace(folder / "first.trace", header, [r for r in mine], end_t_ns=max(
        (getattr(r, "t_ns", 0) for r in mine), default=0) + 1)
    exported = folder / "first.jsonl"
    done = run_cli("export", str(cut), "--format", "mooncake", "-o", str(exported), "--block-size", str(BLOCK))
    assert done.returncode == 0, done.stderr
    again = run_cli("redrive", str(cut), "--url", sandbox.url, "--rid-prefix", SECOND,
                    "--json", str(folder / "second.json"), timeout=300)
    _, _, second_workload, second_hits = recorded(sandbox.trace_dir, SECOND, len(source.requests))
    return dict(source=source, first=first, first_workload=first_workload, first_hits=first_hits,
                rows=[json.loads(line) for line in exported.read_text().splitlines()], again=again,
                second_workload=second_workload, second_hits=second_hits,
                outcomes=json.loads((folder / "second.json").read_text()))


def test_the_first_run_sent_the_workload(round_trip) -> None:
    first = round_trip["first"]
    assert first.count("completed") == len(round_trip["source"].requests) - 1, first.summary()
    assert first.count("aborted") == 1 and first.failed == 0
    assert len(round_trip["first_workload"].requests) == len(round_trip["source"].requests)


def test_redrive_exits_0_and_counts_the_abort(round_trip) -> None:
    again = round_trip["again"]
    assert again.returncode == 0, again.stderr
    assert "8 completed, 0 failed, 1 aborted of 9" in again.stdout
    statuses = [o["status"] for o in round_trip["outcomes"]["outcomes"]]
    assert statuses == ["aborted"] + ["completed"] * 8


def test_second_recording_has_the_same_requests(round_trip) -> None:
    first, second = round_trip["first_workload"].requests, round_trip["second_workload"].requests
    rows = round_trip["rows"]
    assert len(first) == len(second) == len(rows) == 9
    assert [r.input_len for r in second] == [r.input_len for r in first] == [r["input_length"] for r in rows]
    assert [r.priority for r in second] == [r.priority for r in first] == [r["priority"] for r in rows]
    # Same prefix families, block for block: both numbered in first-seen order, so equal lists.
    assert [r.hash_ids for r in second] == [r.hash_ids for r in first] == [r["hash_ids"] for r in rows]
    assert first[1].hash_ids[:20] == first[2].hash_ids[:20] != first[4].hash_ids[:20]
    # What each asked for: the tokens it produced; the dropped one its own ask, dropped again.
    assert [r.output_len for r in second[1:]] == [r.output_len for r in first[1:]]
    assert [r.max_new_tokens for r in second[1:]] == [r.output_len for r in first[1:]]
    assert all(r.ignore_eos for r in second)
    assert [r.client_aborted for r in second] == [r.client_aborted for r in first] == [True] + [False] * 8


def test_second_recording_hits_the_cache_where_the_first_did(round_trip) -> None:
    first = [round_trip["first_hits"].get(f"{FIRST}{n}", 0) > 0 for n in range(9)]
    second = [round_trip["second_hits"].get(f"{SECOND}{n}", 0) > 0 for n in range(9)]
    assert first == second
    assert first[2] and first[3] and first[5] and first[6]  # the families' later members reuse the prefix
    assert not first[1] and not first[7]


def test_input_ids_follow_the_hash_ids() -> None:
    """Block k's tokens come from block k's id alone: shared ids, shared tokens; within the vocabulary."""
    w = synthetic_workload()
    a, b, c = (input_ids(w.requests[i], BLOCK, 512) for i in (1, 2, 4))
    assert len(a) == w.requests[1].input_len and len(b) == w.requests[2].input_len
    assert a[: 20 * BLOCK] == b[: 20 * BLOCK] and a[20 * BLOCK :] != b[20 * BLOCK : len(a)]
    assert a[:BLOCK] != c[:BLOCK]
    assert all(3 <= t < 512 for t in a + b + c)
    assert input_ids(w.requests[1], BLOCK, 512) == a  # the same on every call


def test_a_recorded_abort_is_dropped_ahead_of_the_poll_that_saw_it() -> None:
    """The recorded time is the poll's that saw the drop: the re-drive drops it ABORT_LEAD_S before."""
    from schedtrace.tracer.sandbox.redrive import ABORT_LEAD_S

    def aborted(ms: float) -> WorkloadRequest:
        return WorkloadRequest(t_ms=0.0, input_len=16, output_len=0, hash_ids=[0], max_new_tokens=4,
                               ignore_eos=True, priority=None, finish_reason="abort", client_abort_ms=ms)

    requests = [aborted(4000.0), aborted(ABORT_LEAD_S * 500), synthetic_workload().requests[1]]
    first, early, kept = plan(Workload(block=BLOCK, shared_prefixes=True, requests=requests))
    assert first.abort_after_s == pytest.approx(4.0 - ABORT_LEAD_S)
    assert early.abort_after_s == 0.0 and kept.abort_after_s is None
    [fast] = plan(Workload(block=BLOCK, shared_prefixes=True, requests=requests[:1]), speedup=2.0)
    assert fast.abort_after_s == pytest.approx(2.0 - ABORT_LEAD_S)


def small_trace(path: Path) -> Path:
    records = [Arrival(t_ns=0, rid="x", input_len=40, max_new_tokens=4, prefix_ids=b"\1" * 24),
               Finish(t_ns=10**9, rid="x", output_len=4, reason="length")]
    return write_trace(path, builders.header(prefix_block=BLOCK), records, end_t_ns=2 * 10**9)


def test_a_refusing_server_is_one_line_and_exit_1(tmp_path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    trace = small_trace(tmp_path / "x.trace")
    before = trace.read_bytes()
    done = run_cli("redrive", str(trace), "--url", url, "--vocab", "512")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"schedtrace: error: {url}: connection refused") and "Traceback" not in done.stderr
    assert trace.read_bytes() == before


@pytest.mark.stops_shared_server
def test_a_dying_server_is_one_line_and_exit_1_and_its_trace_stays(sandbox, tmp_path) -> None:
    """The shared sandbox is stopped part way (this test runs after its others): the redrive says so
    in one line, exit 1; the trace it wrote reads back; no process of the server is left.

    The stop waits for the server's own log to show three of the requests prefilled: the scheduler
    has them. The last requests are recorded 20 s in, so the redrive, which sends on the
    recorded clock, cannot have ended by then (a clean-clone make test once served all of a
    9-second load before the log showed three whole prefills)."""
    members = group_members(sandbox.pid)
    assert len(members) >= 3, members  # launcher, scheduler and detokenizer at least, in the server's group
    log_start = log_size(sandbox.log_path)
    requests = [WorkloadRequest(t_ms=400.0 * n if n < 20 else 20_000.0 + 1_000.0 * (n - 20), input_len=2000,
                                output_len=400, hash_ids=list(range(DYING_IDS + n * 125, DYING_IDS + n * 125 + 125)),
                                max_new_tokens=400, ignore_eos=True, priority=None, finish_reason="length")
                for n in range(24)]
    header = builders.header(prefix_block=BLOCK)
    records = [Arrival(t_ns=int(r.t_ms * 1e6), rid=f"d{n}", input_len=r.input_len, max_new_tokens=r.max_new_tokens,
                       ignore_eos=True, prefix_ids=b"".join(i.to_bytes(8, "little") for i in r.hash_ids))
               for n, r in enumerate(requests)]
    trace = write_trace(tmp_path / "load.trace", header, records, end_t_ns=10**10)
    proc = subprocess.Popen([sys.executable, "-c", "from schedtrace.cli import main; main()", "redrive",
                             str(trace), "--url", sandbox.url, "--rid-prefix", "dying-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _prefilled(sandbox.log_path, log_start) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the redrive ended before the server was stopped"
        assert _prefilled(sandbox.log_path, log_start) >= 3, "the server never prefilled three of the requests"
    finally:
        sandbox.stop()  # mid-load: requests in flight and more to send
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"schedtrace: error: {sandbox.url}: the server stopped answering"), err
    assert "Traceback" not in err
    assert _arrived(sandbox.trace_dir, "dying-", 3)  # what was written before the end reads back
    assert not process_group_alive(sandbox.pid) and not sandbox.running
    assert [pid for pid in members if pid_alive(pid)] == []
    sandbox.stop()  # idempotent


DYING_IDS = 2_000_000  # prompts no other test sends: nothing of them is cached


PREFILL_LINE = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")


def _prefilled(log: Path, start: int = 0, input_len: int = 1) -> int:
    """Requests the server's log shows prefilled (after byte ``start``) in batches of at least
    ``input_len`` tokens each."""
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return 0
    return sum(int(seqs) for seqs, tokens in PREFILL_LINE.findall(text) if int(tokens) >= input_len * int(seqs))


def _arrived(trace_dir: Path, prefix: str, count: int) -> bool:
    for path in sorted(trace_dir.glob("*.trace")):
        try:
            with TraceReader(path) as reader:
                seen = sum(1 for _, r in reader.records() if isinstance(r, Arrival) and r.rid.startswith(prefix))
        except SchedtraceError:
            continue
        if seen >= count:
            return True
    return False


def test_a_refusal_counts_as_aborted_only_where_the_recording_had_one() -> None:
    from schedtrace.tracer.sandbox.redrive import _judge

    reply = json.dumps({"meta_info": {"finish_reason": {"type": "abort"}}}).encode()
    for reason, expected in (("rejected", "aborted"), ("abort", "aborted"), ("length", "failed")):
        request = WorkloadRequest(t_ms=0.0, input_len=16, output_len=0, hash_ids=[0], max_new_tokens=4,
                                  ignore_eos=True, priority=None, finish_reason=reason)
        [planned] = plan(Workload(block=BLOCK, shared_prefixes=True, requests=[request]))
        assert _judge(planned, 503, reply).status == expected
        assert _judge(planned, 200, b'{"meta_info": {"completion_tokens": 4}}').status == "completed"
