"""Two scheduler ranks on CPU: ``SandboxServer(tp=2)`` serves and records both ranks.

The tiny Llama at ``--tp 2`` with its real forward (a real gloo all-reduce
between the ranks; pynccl is stood in for): one scheduler process per rank,
each writing its own trace, recorded once per module under a small overload.
Requests complete, the two traces carry tp_rank 0 and 1 and one run id, ``schedtrace
ranks`` finds full agreement, every rank replays at full fidelity, and a
copy with one pass of one rank altered is caught at exactly that pass, with
the field named. Then ``dp=2`` (DP attention, forward stood in for): the DP
ranks are shown side by side, in lockstep, with no desync. Both servers are
started once per module, side by side, and stopped before any test reads.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
import pytest
from conftest import generate

from schedtrace.cli import run
from schedtrace.replay.loop.input import load_input
from schedtrace.replay.loop.scan import scan_trace
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Finish, Footer, Header, Pass
from schedtrace.tracer.recorder.naming import HOST_LIMIT, safe_name
from schedtrace.tracer.sandbox.server import SandboxServer

pytestmark = [pytest.mark.own_server, pytest.mark.timeout(900)]

LENGTHS = [1800, 300, 600, 900, 1200, 450]  # one longer than a chunk; more than the running slots
MAX_NEW_TOKENS = 12
CHUNK = 1024
RANK_ARGS = ("--chunked-prefill-size", str(CHUNK), "--max-running-requests", "4", "--max-total-tokens", "16384")
DP_ARGS = RANK_ARGS[2:]  # sglang picks the chunk size itself, and then splits it over the DP ranks
FINISH_WAIT_S = 30.0
RIDS = {f"ranks-{i}" for i in range(len(LENGTHS))}


def read_rank(path: Path) -> tuple[Header, list]:
    with TraceReader(path) as reader:
        return reader.header, [r for _, r in reader.records()]


def decisions(records: list, rids: set[str]) -> list[tuple[str, ...]]:
    """Each admitting pass's admitted rids, in order (ours only)."""
    return [
        tuple(a.rid for a in r.admitted)
        for r in records
        if isinstance(r, Pass) and any(a.rid in rids for a in r.admitted)
    ]


def finished(folder: Path) -> list[set[str]]:
    """Each trace's finished rids, in file order."""
    return [{r.rid for r in read_rank(p)[1] if isinstance(r, Finish)} for p in sorted(folder.glob("*.trace"))]


def record_run(work: Path, server_of, all_ranks_see_all: bool) -> Path:
    """Serve our requests on ``server_of(trace_dir, log)``, wait for every finish, stop the server (which
    closes the traces); the trace directory. Plain TP: every rank sees every request; DP: one rank each."""
    traces = work / "traces"
    with server_of(traces, work / "server.log") as server:
        with ThreadPoolExecutor(len(LENGTHS)) as pool:
            replies = list(pool.map(lambda i: generate(server, f"ranks-{i}", LENGTHS[i], MAX_NEW_TOKENS),
                                    range(len(LENGTHS))))
        for i, reply in enumerate(replies):
            assert reply["meta_info"]["id"] == f"ranks-{i}"
            assert reply["meta_info"]["completion_tokens"] == MAX_NEW_TOKENS
        deadline = time.monotonic() + FINISH_WAIT_S
        while time.monotonic() < deadline:  # each rank's writer flushes on its own
            done = finished(traces)
            if len(done) == 2 and (all(RIDS <= d for d in done) if all_ranks_see_all else RIDS <= set.union(*done)):
                break
            time.sleep(0.2)
    return traces


def tp2_server(traces: Path, log: Path) -> SandboxServer:
    server = SandboxServer(tp=2, trace_dir=traces, log_path=log, extra_args=RANK_ARGS)
    assert server.stand_ins == ("no-pynccl",)  # the real forward, across two ranks
    return server


def dp2_server(traces: Path, log: Path) -> SandboxServer:
    return SandboxServer(dp=2, trace_dir=traces, log_path=log, extra_args=DP_ARGS)


@pytest.fixture(scope="module")
def rank_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The traces of one ``tp=2`` and one ``dp=2`` (DP attention) run, recorded side by side: their
    starts overlap, and the idle one sleeps (``--sleep-on-idle``). Both servers are stopped before
    any test reads a trace."""
    runs = {"tp2": (tp2_server, True), "dp2": (dp2_server, False)}
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(record_run, tmp_path_factory.mktemp(name), server_of, all_see_all)
                   for name, (server_of, all_see_all) in runs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def tp2(rank_runs: dict[str, Path]) -> Path:
    return rank_runs["tp2"]


@pytest.fixture(scope="module")
def dp2(rank_runs: dict[str, Path]) -> Path:
    return rank_runs["dp2"]


def test_tp2_serves_and_writes_one_trace_per_rank(tp2: Path) -> None:
    ranks = [read_rank(p) for p in sorted(tp2.glob("*.trace"))]
    assert len(ranks) == 2, [h.tp_rank for h, _ in ranks]
    assert sorted(h.tp_rank for h, _ in ranks) == [0, 1]
    assert all(h.tp_size == 2 for h, _ in ranks)
    for (header, _), done in zip(ranks, finished(tp2)):
        assert RIDS <= done, f"tp{header.tp_rank} has no finish for {sorted(RIDS - done)}"
    (_, first), (_, second) = ranks
    assert decisions(first, RIDS) == decisions(second, RIDS) != []


def test_both_ranks_share_the_launchers_run_id_and_record_their_placement(tp2: Path) -> None:
    """One run id for every rank of a server start: the launcher's, which reaches the spawned
    scheduler ranks through the environment alone. Each rank's header and file name say where it sits."""
    paths = sorted(tp2.glob("*.trace"))
    headers = [read_rank(path)[0] for path in paths]
    (run_id,) = {h.run_id for h in headers}
    assert run_id
    assert len({h.pid for h in headers}) == 2  # two processes
    host = safe_name(socket.gethostname(), HOST_LIMIT)
    for path, h in zip(paths, headers):
        assert (h.tp_size, h.pp_rank, h.pp_size, h.dp_rank, h.dp_size) == (2, 0, 1, None, 1)
        assert (h.attn_tp_rank, h.attn_tp_size, h.attn_dp_rank, h.attn_dp_size) == (h.tp_rank, 2, None, 1)
        assert path.name == f"schedtrace-{run_id}-{host}-tp{h.tp_rank}-dp0-pp0-pid{h.pid}.part000.trace"


def chunk_sizes(records: list) -> set[int | None]:
    return {r.chunked_prefill_size for r in records if isinstance(r, Pass)}


def test_the_header_records_what_the_scheduler_resolved(tp2: Path, dp2: Path, tmp_path: Path) -> None:
    """The chunk size the scheduler uses (given: 1024; not given: sglang's default, split over the DP
    ranks), and that the overlap loop ran (the tiny Llama does not disable it)."""
    for header, records in map(read_rank, sorted(tp2.glob("*.trace"))):
        assert header.server_args.chunked_prefill_size == CHUNK and chunk_sizes(records) == {CHUNK}
        assert header.overlap_schedule is True
    for header, records in map(read_rank, sorted(dp2.glob("*.trace"))):
        assert chunk_sizes(records) == {header.server_args.chunked_prefill_size}
        assert header.server_args.chunked_prefill_size is not None
        assert header.overlap_schedule is True
    trace = sorted(tp2.glob("*.trace"))[0]  # the closed loop takes the recorded fact over its inference
    header, records = read_rank(trace)
    with TraceReader(trace) as reader:
        assert scan_trace(reader).overlap is load_input(reader).overlap is True
    told = write_trace(tmp_path / trace.name, msgspec.structs.replace(header, overlap_schedule=False),
                       [r for r in records if not isinstance(r, (Header, Footer))])
    with TraceReader(told) as reader:
        assert scan_trace(reader).overlap is True and load_input(reader).overlap is False


def ranks_json(folder: Path, capsys: pytest.CaptureFixture[str], status: int) -> dict:
    capsys.readouterr()
    assert run(["ranks", str(folder), "--json", "-"]) == status
    return json.loads(capsys.readouterr().out)


def test_ranks_finds_full_agreement(tp2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = ranks_json(tp2, capsys, 0)
    assert report["mode"] == "tp" and report["verdict"] == "agree"
    assert [r["rank"] for r in report["ranks"]] == ["tp0", "tp1"]
    assert all(r["closed_cleanly"] and r["lost"] == 0 for r in report["ranks"])
    (group,) = report["groups"]
    assert group["agree"] and group["compared_until"] == max(r["clock"] for r in report["ranks"]) > 0
    assert report["first"] is None and report["header_diffs"] == []


def test_every_rank_replays_at_full_fidelity(tp2: Path, tmp_path: Path) -> None:
    out = tmp_path / "replay.json"
    assert run(["replay", str(tp2), "--old", "stock", "--new", "stock", "--json", str(out)]) == 0
    reports = json.loads(out.read_bytes())["ranks"]
    assert sorted(reports) == ["tp0", "tp1"]
    for label, report in reports.items():
        fidelity = report["fidelity"]
        assert fidelity["matched"] == fidelity["total"] > 0, (label, fidelity["mismatches"][:3])


def _bump_slots(p: Pass) -> Pass:
    return msgspec.structs.replace(p, req_slots_free=p.req_slots_free + 1)


def _shorten_admission(p: Pass) -> Pass:
    first = p.admitted[0]
    return msgspec.structs.replace(p, admitted=[msgspec.structs.replace(first, extend_len=first.extend_len - 1),
                                                *p.admitted[1:]])


@pytest.mark.parametrize(("alter", "kind", "field"), [
    (_bump_slots, "inputs", "req_slots_free"),
    (_shorten_admission, "decision", "decision.admitted[0][1]"),  # (rid, extend_len)
])
def test_one_altered_pass_of_one_rank_is_caught_there(tp2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       alter, kind: str, field: str) -> None:
    """tp1 rewritten with the project's writer, one admitting pass in the middle changed."""
    copy = tmp_path / "altered"
    copy.mkdir()
    (first, second) = sorted(tp2.glob("*.trace"))
    (copy / first.name).write_bytes(first.read_bytes())
    header, records = read_rank(second)
    body = [r for r in records if not isinstance(r, (Header, Footer))]
    admitting = [i for i, r in enumerate(body) if isinstance(r, Pass) and r.admitted]
    at = admitting[len(admitting) // 2]
    seq = body[at].seq
    body[at] = alter(body[at])
    write_trace(copy / second.name, header, body)

    report = ranks_json(copy, capsys, 1)
    assert report["verdict"] == "desync"
    diff = report["first"]
    assert (diff["odd"], diff["reference"]) == (["tp1"], ["tp0"])  # a tie: the lowest rank's class is the reference
    assert diff["passes"]["tp1"] == seq and diff["points"] == 1 and report["later_total"] == 0
    assert diff["kind"] == kind
    assert [f["field"] for f in diff["fields"]] == [field]


def test_dp_attention_ranks_are_shown_side_by_side_without_a_desync(dp2: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Each DP rank schedules its own requests: no pair of ranks must agree, and their pass clocks move together."""
    done = finished(dp2)
    assert len(done) == 2 and RIDS <= set.union(*done) and not done[0] & done[1]  # each request on one rank
    report = ranks_json(dp2, capsys, 0)
    assert report["mode"] == "dp-attention" and report["verdict"] == "agree"
    assert report["first"] is None and report["header_diffs"] == []
    assert sorted(g["group"] for g in report["groups"]) == ["attn-dp 0", "attn-dp 1"]
    dp = report["dp"]
    assert dp["ranks"] == [r["rank"] for r in report["ranks"]] and len(dp["ranks"]) == 2
    admitted = [sum(c["admitted"] for row in dp["rows"] for c in row["cells"] if c["rank"] == r) for r in dp["ranks"]]
    assert all(admitted), admitted  # both ranks served
    lock = dp["lockstep"]
    assert lock["exact"] and not lock["broken"], lock
    assert run(["ranks", str(dp2)]) == 0
    assert "DP ranks side by side" in capsys.readouterr().out
