"""Every command reads trace sets: files, globs or directories, per rank, a rank's parts as one trace.

The traces are real ones cut into parts the way the recorder rotates them
(each part a complete trace with its own header, passes numbered on), and a
second rank copied from the first under another tp rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import PROG, run
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Footer, Header, KvSnapshot, Pass, PoolLayout, WaitingReq
from schedtrace.testing.synthetic import generate

from loop_traces import latch_reproduction

RUN = "run-a"
PARTS = 3


def part_name(folder: Path, tp: int, part: int) -> Path:
    return folder / f"schedtrace-{RUN}-host-tp{tp}-dp0-pp0-pid1.part{part:03d}.trace"


def split_into_parts(trace: Path, folder: Path, parts: int = PARTS, *, tp: int = 0, tp_size: int = 1) -> list[Path]:
    """``trace`` rotated into ``parts`` files at pass boundaries, as rank ``tp`` of run ``RUN``."""
    folder.mkdir(parents=True, exist_ok=True)
    with TraceReader(trace) as reader:
        header = reader.header
        records = [r for _, r in reader.records() if not isinstance(r, (Header, Footer))]
    pass_at = [i for i, r in enumerate(records) if isinstance(r, Pass)]
    cuts = [0] + [pass_at[len(pass_at) * k // parts] for k in range(1, parts)] + [len(records)]
    paths = []
    for part, (start, stop) in enumerate(zip(cuts, cuts[1:])):
        chunk = records[start:stop]
        first = next(r.seq for r in chunk if isinstance(r, Pass))
        part_header = msgspec.structs.replace(header, run_id=RUN, tp_rank=tp, tp_size=tp_size, part=part,
                                              first_pass=first if part else header.first_pass)
        paths.append(write_trace(part_name(folder, tp, part), part_header, chunk))
    return paths


def json_of(args: list[str], capsys, status: int = 0) -> dict:
    assert run([*args, "--json", "-"]) == status
    return json.loads(capsys.readouterr().out)


# What names the files rather than what they hold: paths, sizes and the files' fingerprint.
FILE_FIELDS = ("trace", "file", "parts", "file_size", "header", "trace_fingerprint")


def without_paths(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in FILE_FIELDS}


@pytest.fixture(scope="module")
def latch(tmp_path_factory) -> Path:
    return latch_reproduction(tmp_path_factory.mktemp("whole") / "latch.trace")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, latch) -> Path:
    """Rank tp0 in three parts, rank tp1 in three parts: one run."""
    folder = tmp_path_factory.mktemp("ranks")
    split_into_parts(latch, folder, tp=0, tp_size=2)
    split_into_parts(latch, folder, tp=1, tp_size=2)
    return folder


def test_the_parts_of_one_rank_read_as_the_whole_trace(tmp_path, latch, capsys):
    parts = split_into_parts(latch, tmp_path / "parts")
    whole = json_of(["info", str(latch)], capsys)
    as_parts = json_of(["info", str(tmp_path / "parts" / "*.trace")], capsys)  # a glob pattern, as a quoted argument leaves it
    assert as_parts["passes"] == whole["passes"] == 10
    assert as_parts["pass_records"] == whole["pass_records"]
    assert as_parts["parts"] == [str(p) for p in parts]
    assert as_parts["anomalies"] == whole["anomalies"]
    # The parts given in any order, or as their directory, are the same trace.
    assert json_of(["info", *map(str, reversed(parts))], capsys) == as_parts
    assert json_of(["info", str(tmp_path / "parts")], capsys) == as_parts
    run(["info", str(tmp_path / "parts")])
    assert "read as one trace with 2 later parts" in capsys.readouterr().out


def test_replay_and_bisect_of_the_parts_match_the_whole_trace(tmp_path, latch, capsys):
    split_into_parts(latch, tmp_path / "parts")
    for command, status in (("replay", 0), ("bisect", 1)):
        whole = json_of([command, str(latch)], capsys, status)
        parts = json_of([command, str(tmp_path / "parts")], capsys, status)
        assert parts["trace"] == str(part_name(tmp_path / "parts", 0, 0))
        assert without_paths(parts) == without_paths(whole), command
    loop = json_of(["replay", str(tmp_path / "parts"), "--closed-loop"], capsys)["closed_loop"]
    assert loop == json_of(["replay", str(latch), "--closed-loop"], capsys)["closed_loop"]
    assert loop["arms"]["stock"]["stalls"] >= 1


def test_workers_reopen_every_part_of_a_rank(tmp_path, capsys):
    """--jobs 2 splits the passes over processes that open the rank's parts themselves."""
    trace = tmp_path / "long.trace"
    generate(trace, 4200)
    split_into_parts(trace, tmp_path / "parts")
    one = json_of(["replay", str(tmp_path / "parts"), "--jobs", "1"], capsys)
    two = json_of(["replay", str(tmp_path / "parts"), "--jobs", "2"], capsys)
    assert one == two and one["passes"] == 4200


def test_a_missing_part_is_named_in_one_line(tmp_path, latch, capfd):
    parts = split_into_parts(latch, tmp_path / "parts")
    parts[1].unlink()
    for command in ("info", "replay", "bisect", "export", "tui"):
        extra = ["--format", "chrome"] if command == "export" else []
        assert run([command, str(tmp_path / "parts"), *extra]) == 2
        lines = capfd.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), command
        assert parts[1].name in lines[0] and "missing" in lines[0], command


def test_two_ranks_report_per_rank(two_ranks, capsys):
    info = json_of(["info", str(two_ranks)], capsys)
    assert info["run"] == RUN and list(info["ranks"]) == ["tp0", "tp1"]
    assert [s["header"]["tp_rank"] for s in info["ranks"].values()] == [0, 1]
    assert {s["passes"] for s in info["ranks"].values()} == {10}
    assert run(["info", str(two_ranks)]) == 0
    printed = capsys.readouterr().out
    assert "rank tp0" in printed and "rank tp1" in printed

    replay = json_of(["replay", str(two_ranks)], capsys)
    assert list(replay["ranks"]) == ["tp0", "tp1"]
    tp0, tp1 = replay["ranks"].values()
    # The ranks agree: tp0 is replayed, and tp1's report is tp0's, saying so and why.
    assert tp0["same_as"] is None and tp1["same_as"] == "tp0" and "agreed with tp0" in tp1["same_as_why"]
    same = ("same_as", "same_as_why")
    assert ({k: v for k, v in without_paths(tp0).items() if k not in same}
            == {k: v for k, v in without_paths(tp1).items() if k not in same}) and tp0["passes"] == 10
    assert tp1["trace"].endswith("tp1-dp0-pp0-pid1.part000.trace")  # its own file
    assert tp0["stalls"]["stock"]  # each rank's own report, the single-rank shape inside
    assert run(["replay", str(two_ranks), "--fail-on", "divergence"]) == 1
    assert "tripped on tp0, tp1" in capsys.readouterr().err


def test_rank_picks_one_rank_and_keeps_the_one_rank_json(two_ranks, latch, capsys):
    info = json_of(["info", str(two_ranks), "--rank", "tp1"], capsys)
    assert info["header"]["tp_rank"] == 1 and "ranks" not in info
    assert json_of(["info", str(two_ranks), "--rank", "1"], capsys) == info  # a bare tp rank
    replay = json_of(["replay", str(two_ranks), "--rank", "tp1"], capsys)
    assert without_paths(replay) == without_paths(json_of(["replay", str(latch)], capsys))


def test_a_rank_or_run_that_is_not_there_is_one_line(two_ranks, tmp_path, latch, capfd):
    assert run(["info", str(two_ranks), "--rank", "tp7"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "--rank tp7 names no rank" in err and "tp0, tp1" in err
    other = tmp_path / "other"
    split_into_parts(latch, other, parts=1)
    run_b = other / "b.trace"
    with TraceReader(latch) as reader:
        write_trace(run_b, msgspec.structs.replace(reader.header, run_id="run-b"),
                    [r for _, r in reader.records() if not isinstance(r, (Header, Footer))])
    assert run(["tui", str(other)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "choose one with --run" in err
    assert run(["info", str(other), "--run", "run-b", "--json", "-"]) == 0
    assert json.loads(capfd.readouterr().out)["header"]["tp_rank"] == 0


# --- hybrid pools ---------------------------------------------------------------

SWA_LAYOUT = PoolLayout("SWATokenToKVPoolAllocator", "SWARadixCache", 40000, swa_size=8000, sliding_window=128)


def swa_trace(path: Path) -> Path:
    """Three passes: the full pool roomy, the SWA pool filling up, so SWA limits from the second."""
    head = WaitingReq("w0", 100, 0, 16, 0)
    kvs = [KvSnapshot(36000, 0, swa_available=7000, swa_evictable=500, protected=0, swa_protected=0),
           KvSnapshot(30000, 1000, swa_available=900, swa_evictable=100, protected=10, swa_protected=20),
           KvSnapshot(20000, 0, swa_available=300, swa_evictable=0, protected=30, swa_protected=40)]
    passes = [builders.pass_record(n, kv=kv, waiting=[head], req_slots_free=0, repeat=1 + n)
              for n, kv in enumerate(kvs)]
    return write_trace(path, builders.header(is_hybrid_swa=True, pools=SWA_LAYOUT), passes)


def test_info_shows_each_pool_and_the_limiting_one(tmp_path, capsys):
    trace = swa_trace(tmp_path / "swa.trace")
    summary = json_of(["info", str(trace)], capsys)
    full, swa = summary["pools"]
    assert (full["pool"], full["size"], full["free"], full["evictable"], full["protected"]) == ("full", 40000, 20000,
                                                                                                0, 30)
    assert (swa["pool"], swa["size"], swa["free"], swa["evictable"], swa["protected"]) == ("swa", 8000, 300, 0, 40)
    assert (swa["lowest_free_evictable"], swa["lowest_at_pass"]) == (300, 2)
    # Pass 0: full 36000/40000 = 0.90 vs SWA 7500/8000 = 0.94; then SWA has less room. Repeats count.
    assert (full["limiting_passes"], swa["limiting_passes"]) == (1, 2 + 3)
    assert summary["header"]["pools"]["swa_size"] == 8000
    assert run(["info", str(trace)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["swa", "(tokens)", "8000", "300", "0", "40", "300", "@2", "5"] in rows


def test_a_plain_model_shows_no_pool_table(latch, capsys):
    assert json_of(["info", str(latch)], capsys)["pools"] is None
    assert run(["info", str(latch)]) == 0
    assert "pools at the last pass" not in capsys.readouterr().out


def test_replay_prints_how_each_fix_meets_the_pools(tmp_path, capsys):
    trace = write_trace(tmp_path / "swa.trace", builders.header(is_hybrid_swa=True, pools=SWA_LAYOUT),
                        [builders.pass_record(0, kv=KvSnapshot(30000, 0, swa_available=7000, swa_evictable=0))])
    report = json_of(["replay", str(trace)], capsys)
    assert report["fix_notes"]["latch"].startswith("already present:")
    assert run(["replay", str(trace)]) == 0
    printed = capsys.readouterr().out
    assert "fixes on these pools:" in printed and "latch: already present" in printed
    assert run(["replay", str(latch_reproduction(tmp_path / "plain.trace"))]) == 0
    assert "fixes on these pools:" not in capsys.readouterr().out
