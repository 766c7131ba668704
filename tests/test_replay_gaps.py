"""Issue 12, defect 6: replay, bisect and info show a trace's holes, and replay everything present.

A real sample trace (v2, framed) is copied twice: once with ``loss`` records
written into it, as the recorder writes them, and then with one byte flipped
inside a batch in the middle, which makes that batch an unreadable region.
Everything runs the real reader, the real sglang replay and the real CLI.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import PROG, run
from schedtrace.tracer.analysis.holes import holes_of, scan_holes
from schedtrace.tracer.contract.errors import ReportMismatchError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter
from schedtrace.tracer.contract.framing import MARKER_PREFIX, Marker, read_marker
from schedtrace.tracer.contract.names import LOSS_PAUSED, LOSS_QUEUE_FULL
from schedtrace.tracer.contract.report import MAX_HOLES_LISTED, Report, dump_report, load_report
from schedtrace.tracer.contract.report_check import check_report
from schedtrace.tracer.contract.schema import Loss, Pass
from schedtrace.testing.synthetic import generate

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "hybrid-swa-gptoss.trace"
# Loss records written before these passes (so each falls after the pass before).
LOSSES = {120: Loss(0, 578, LOSS_QUEUE_FULL), 300: Loss(0, 9, LOSS_PAUSED)}
RECORDS_PER_WRITE = 40  # the copy's batches: several passes each, as a loaded recorder writes them


def with_losses(source: Path, target: Path, losses: dict[int, Loss]) -> Path:
    """``source`` rewritten by the real writer, with ``losses[seq]`` written just before pass ``seq``."""
    with TraceReader(source) as reader:
        header = reader.header
        records = [record for offset, record in reader.records() if offset]
    writer = TraceWriter(target, header)
    batch: list = []
    for record in records:
        if type(record) is Pass and record.seq in losses:
            batch.append(msgspec.structs.replace(losses[record.seq], t_ns=record.t_ns))
        batch.append(record)
        if len(batch) >= RECORDS_PER_WRITE:
            writer.write_many(batch)
            batch = []
    writer.write_many(batch)
    writer.close(max(getattr(r, "t_ns", 0) for r in records))
    return target


def markers(path: Path) -> list[Marker]:
    data = path.read_bytes()
    found, at = [], data.find(MARKER_PREFIX)
    while at >= 0:
        marker = read_marker(data, at, len(data))
        if isinstance(marker, Marker):
            found.append(marker)
        at = data.find(MARKER_PREFIX, at + 1)
    return found


def damage_batch(source: Path, target: Path, at_pass: int) -> Marker:
    """Copy ``source`` with one byte flipped inside the batch holding pass ``at_pass``; that batch's marker."""
    with TraceReader(source) as reader:
        offset = reader.pass_offsets[at_pass - reader.header.first_pass]
    batch = next(m for m in markers(source) if m.payload <= offset < m.end)
    data = bytearray(source.read_bytes())
    data[offset + 3] ^= 0xFF
    target.write_bytes(bytes(data))
    return batch


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("holes")
    lossy = with_losses(SAMPLE, folder / "lossy.trace", LOSSES)
    batch = damage_batch(lossy, folder / "damaged.trace", at_pass=200)
    with TraceReader(lossy) as reader:
        count, offsets = reader.pass_count, list(reader.pass_offsets)
    with TraceReader(folder / "damaged.trace", skip_damaged=True) as reader:
        present = [p.seq for p in reader.passes()]
    return {"lossy": lossy, "damaged": folder / "damaged.trace", "batch": batch, "count": count,
            "offsets": offsets, "present": present}


@pytest.fixture(scope="module")
def replayed(traces, tmp_path_factory) -> dict:
    """``schedtrace replay --fail-on gaps`` of the damaged copy, once: status, stdout, stderr, report."""
    out = tmp_path_factory.mktemp("replayed") / "report.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        status = run(["replay", str(traces["damaged"]), "--fail-on", "gaps", "--json", str(out)])
    return {"status": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
            "report": load_report(out), "path": out}


def test_the_copies_hold_what_the_tests_expect(traces) -> None:
    """The damage is one batch in the middle holding several passes; the rest reads."""
    batch, present, count = traces["batch"], traces["present"], traces["count"]
    assert batch.n_records > 1 and 0 < min(set(range(count)) - set(present)) < max(present) < count
    with TraceReader(traces["lossy"]) as reader:
        assert reader.closed_cleanly and len(list(reader.passes())) == count


def test_fidelity_counts_only_the_passes_present(traces, replayed) -> None:
    report: Report = replayed["report"]
    present = len(traces["present"])
    assert report.passes == present == traces["count"] - report.holes.passes_lost
    assert report.fidelity.total == present + report.aiter_events
    assert report.fidelity.matched == report.fidelity.total  # every pass present reproduced
    assert any("results are over the" in w and f"{present:,} passes present" in w for w in report.warnings)


def test_the_region_names_its_bytes_and_the_passes_lost(traces, replayed) -> None:
    batch, present = traces["batch"], set(traces["present"])
    (region,) = replayed["report"].holes.regions
    assert (region.start, region.end, region.records_lost) == (batch.offset, batch.end, batch.n_records)
    missing = sorted(set(range(traces["count"])) - present)
    assert (region.first_pass, region.last_pass, region.passes_lost) == (missing[0], missing[-1], len(missing))
    assert missing == list(range(missing[0], missing[-1] + 1))
    # The first pass lost is the first whose record was in the batch.
    assert traces["offsets"][region.first_pass] >= batch.payload > traces["offsets"][region.first_pass - 1]


def test_passes_after_the_region_were_replayed(traces, replayed) -> None:
    report, count = replayed["report"], traces["count"]
    (region,) = report.holes.regions
    after = count - 1 - region.last_pass
    assert after > 100 and report.passes == region.first_pass + after  # not stopped at the hole


def test_loss_records_are_listed_after_the_pass_they_fell_at(replayed) -> None:
    holes = replayed["report"].holes
    assert [(loss.reason, loss.count, loss.after_pass) for loss in holes.losses] == [
        (loss.reason, loss.count, seq - 1) for seq, loss in sorted(LOSSES.items())]
    assert holes.loss_count == 2
    assert holes.records_lost == sum(loss.count for loss in LOSSES.values()) + holes.regions[0].records_lost


def test_the_cli_prints_one_line_per_hole_and_fails_on_gaps(replayed) -> None:
    assert replayed["status"] == 1, replayed["stderr"]
    assert replayed["stderr"] == f"{PROG}: --fail-on gaps: tripped\n"
    lines = replayed["stdout"].splitlines()
    holes = replayed["report"].holes
    region = holes.regions[0]
    hole_lines = [line for line in lines if "records lost" in line and line.startswith("  ")]
    assert len(hole_lines) == holes.count == 3
    assert hole_lines[0].strip().startswith(f"{region.end - region.start:,} bytes unreadable at offset "
                                            f"{region.start}–{region.end}, {region.records_lost} records lost, "
                                            f"passes {region.first_pass}–{region.last_pass} missing")
    assert hole_lines[1].strip().startswith("578 records lost after pass 119 (queue_full")
    assert any(line.startswith("fidelity (stock vs recording): ") and line.endswith(" over the passes present")
               for line in lines)
    assert "Traceback" not in replayed["stdout"] + replayed["stderr"]


def test_the_report_checks_against_its_trace_and_refuses_holes_outside_it(traces, replayed) -> None:
    report = replayed["report"]
    with TraceReader(traces["damaged"], skip_damaged=True) as reader:
        check_report(report, reader, "report.json")
        far = msgspec.structs.replace(report.holes.regions[0], end=reader.file_size + 1)
        with pytest.raises(ReportMismatchError, match="unreadable region end at offset"):
            check_report(msgspec.structs.replace(report, holes=msgspec.structs.replace(
                report.holes, regions=[far])), reader, "report.json")
        lost = msgspec.structs.replace(report.holes, passes_lost=report.holes.passes_lost + 1)
        with pytest.raises(ReportMismatchError, match="and lost"):
            check_report(msgspec.structs.replace(report, holes=lost), reader, "report.json")


def test_a_version_1_report_loads_with_no_holes(replayed, tmp_path) -> None:
    data = json.loads(dump_report(replayed["report"]))
    del data["holes"]
    data["version"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    old = load_report(path)
    assert old.version == 1 and old.holes.count == 0 and old.holes.regions == []


def test_info_lists_the_hole_and_never_says_closed_cleanly(traces, capsys) -> None:
    assert run(["info", str(traces["damaged"])]) == 0
    out = capsys.readouterr().out
    (state,) = [line for line in out.splitlines() if line.startswith("file: ")]
    assert "NOT closed cleanly" in state and "1 unreadable region" in state
    batch = traces["batch"]
    assert f"bytes unreadable at offset {batch.offset}–{batch.end}, {batch.n_records} records lost" in out
    assert run(["info", str(traces["damaged"]), "--json", "-"]) == 0
    holes = json.loads(capsys.readouterr().out)["holes"]
    assert holes["region_count"] == 1 and holes["loss_count"] == 2


def test_info_lists_loss_records_of_a_cleanly_closed_trace(traces, capsys) -> None:
    assert run(["info", str(traces["lossy"])]) == 0
    out = capsys.readouterr().out
    assert "file: " in out and ", closed cleanly" in out
    assert "578 records lost after pass 119 (queue_full" in out and "9 records lost after pass 299 (paused" in out


def test_bisect_runs_over_the_passes_present_and_reports_the_holes(traces, capsys) -> None:
    status = run(["bisect", str(traces["damaged"]), "--mode", "open-loop", "--json", "-"])
    out = capsys.readouterr()
    assert status == 0 and "Traceback" not in out.err
    holes = json.loads(out.out)["holes"]
    assert holes["region_count"] == 1 and holes["regions"][0]["start"] == traces["batch"].offset
    assert [loss["after_pass"] for loss in holes["losses"]] == [seq - 1 for seq in sorted(LOSSES)]


def test_holes_are_counted_in_full_and_listed_up_to_the_bound(tmp_path) -> None:
    many = {seq: Loss(0, 1, LOSS_QUEUE_FULL) for seq in range(1, MAX_HOLES_LISTED + 40)}
    source = tmp_path / "many.trace"
    shutil.copy(SAMPLE, source)
    with TraceReader(with_losses(source, tmp_path / "many-losses.trace", many)) as reader:
        holes = scan_holes(reader)
    assert holes.loss_count == len(many) == holes.records_lost
    assert len(holes.losses) == MAX_HOLES_LISTED
    assert holes_of([], [], [], 0).count == 0


def test_a_damaged_trace_replays_to_the_same_bytes_on_one_and_two_workers(tmp_path) -> None:
    from schedtrace.replay.engine import MIN_PASSES_PER_JOB, replay_trace

    long = tmp_path / "long.trace"
    generate(long, 2 * MIN_PASSES_PER_JOB + 200)
    batch = damage_batch(long, tmp_path / "damaged.trace", at_pass=MIN_PASSES_PER_JOB)
    one = dump_report(replay_trace(tmp_path / "damaged.trace", jobs=1))
    two = dump_report(replay_trace(tmp_path / "damaged.trace", jobs=2))
    assert one == two
    report = json.loads(one)
    assert [r["start"] for r in report["holes"]["regions"]] == [batch.offset]
    assert report["passes"] + report["holes"]["passes_lost"] == 2 * MIN_PASSES_PER_JOB + 200


def test_a_closed_loop_past_the_hole_is_the_one_on_the_whole_copy(traces) -> None:
    """Pass numbers, not positions: the damaged copy's closed loop from a pass after its hole
    starts from that pass, places arrivals and prefix matches on the same steps, and checks
    itself against the same recorded waits as the copy the hole was made in."""
    from schedtrace.replay.loop.run import load_input, run_closed_loop, scan_trace

    lost = sorted(set(range(traces["count"])) - set(traces["present"]))
    start = lost[-1] + 40
    seen = []
    for path, skip_damaged in ((traces["lossy"], False), (traces["damaged"], True)):
        with TraceReader(path, skip_damaged=skip_damaged) as reader:
            loop = load_input(reader, start, scan_trace(reader))
            steps = [step for step, _ in loop.arrivals], [(step, rid) for step, rid, _, _ in loop.matches]
            seen.append((loop.start.seq, steps, run_closed_loop(reader, ["stock", "fixed"], from_pass=start)))
    (whole_seq, whole_steps, whole), (seq, steps, damaged) = seen
    assert seq == whole_seq == start and steps == whole_steps and whole_steps[0]
    assert damaged.self_check == whole.self_check and damaged.self_check.requests > 0
    assert damaged.arms == whole.arms


def test_a_closed_loop_from_a_lost_pass_is_one_line_naming_the_passes_read_beside_it(traces, capsys) -> None:
    lost = sorted(set(range(traces["count"])) - set(traces["present"]))
    status = run(["replay", str(traces["damaged"]), "--closed-loop", "--from", str(lost[3])])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert (f"--from {lost[3]}: {traces['damaged']}: pass {lost[3]} was lost in an unreadable region; "
            f"the nearest passes read are {lost[0] - 1} and {lost[-1] + 1}") in err


def test_a_closed_loop_from_a_lost_first_pass_names_the_first_pass_read(traces, tmp_path, capsys) -> None:
    damaged = tmp_path / "first-lost.trace"
    damage_batch(traces["lossy"], damaged, at_pass=0)
    with TraceReader(damaged, skip_damaged=True) as reader:
        first = next(reader.passes()).seq
    assert first > 0
    status = run(["replay", str(damaged), "--closed-loop"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"--from 0: {damaged}: pass 0 was lost in an unreadable region; the first pass read is {first}" in err
