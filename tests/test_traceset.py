"""Trace sets: runs, ranks and parts grouped from files, and one rank's parts read as one trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from schedtrace.testing import builders
from schedtrace.tracer.contract.errors import TraceNotFoundError, TraceSetError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, write_trace
from schedtrace.tracer.contract.schema import Arrival, Header, Pass
from schedtrace.tracer.contract.rank_keys import rank_label
from schedtrace.tracer.contract.traceset import open_traceset

PASSES_PER_PART = 4


def part_records(first: int) -> list:
    """An arrival before each pass, so offsets and passes interleave as in a real trace."""
    out: list = []
    for seq in range(first, first + PASSES_PER_PART):
        out += [Arrival(seq * 1000, f"r{seq}", 10 + seq, 5), builders.pass_record(seq)]
    return out


def write_rank(folder: Path, parts: int, *, run_id: str = "run-a", tp: int = 0, pid: int = 7,
               start: int = 0, skip: tuple[int, ...] = (), first_pass_of: dict[int, int] | None = None) -> list[Path]:
    """One rank's parts, named as the recorder names them; ``skip`` leaves parts out."""
    folder.mkdir(exist_ok=True)
    paths = []
    for part in range(parts):
        first = (first_pass_of or {}).get(part, part * PASSES_PER_PART)
        if part in skip:
            continue
        header = builders.header(run_id=run_id, tp_rank=tp, tp_size=2, pid=pid, start_wall_ns=start, part=part,
                                 first_pass=first)
        path = folder / f"schedtrace-tp{tp}-dp0-pid{pid}.part{part:03d}.trace"
        write_trace(path, header, part_records(first))
        paths.append(path)
    return paths


def test_parts_given_out_of_order_read_as_one_trace_in_order(tmp_path: Path) -> None:
    paths = write_rank(tmp_path, 3)
    with open_traceset(reversed(paths)) as traces:
        rank = traces.rank()
        assert [p.header.part for p in rank.parts] == [0, 1, 2]
        assert rank.pass_count == 12
        assert [p.seq for p in rank.passes()] == list(range(12))
        assert [p.seq for p in rank.passes(3, 9)] == list(range(3, 9))
        assert rank.pass_at(9).seq == 9
        records = list(rank.records())
        assert sum(isinstance(r, Header) for _, r in records) == 1  # the later parts' headers are not replayed
        assert [r.seq for _, r in records if isinstance(r, Pass)] == list(range(12))
        # global offsets: each leads back to its record, and the index agrees with the stream
        assert all(rank.record_at(offset) == record for offset, record in records)
        assert list(rank.pass_offsets) == [o for o, r in records if isinstance(r, Pass)]
        resumed = [r for _, r in rank.records(rank.pass_offsets[6])]
        assert [r.seq for r in resumed if isinstance(r, Pass)] == list(range(6, 12))
        assert rank.closed_cleanly and rank.truncated_at is None
        assert rank.file_size == sum(p.stat().st_size for p in paths)


def test_one_file_reads_as_its_reader_does(tmp_path: Path) -> None:
    (path,) = write_rank(tmp_path, 1)
    with open_traceset([path]) as traces, TraceReader(path) as reader:
        rank = traces.rank()
        assert list(rank.records()) == list(reader.records())
        assert list(rank.pass_offsets) == list(reader.pass_offsets)
        assert rank.header == reader.header and rank.path == str(path)


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    write_rank(tmp_path, 4, skip=(2,))
    with pytest.raises(TraceSetError) as caught:
        open_traceset([tmp_path])
    message = str(caught.value)
    assert "schedtrace-tp0-dp0-pid7.part002.trace" in message and "missing" in message
    assert "part001.trace" in message and "part003.trace" in message


def test_a_part_whose_passes_do_not_continue_is_named(tmp_path: Path) -> None:
    write_rank(tmp_path, 3, first_pass_of={2: 5})  # part 1 ends before pass 8, part 2 claims to start at 5
    with pytest.raises(TraceSetError, match=r"part002\.trace: part 2 starts at pass 5, .* ends before pass 8"):
        open_traceset([tmp_path])


def test_a_duplicate_part_is_named(tmp_path: Path) -> None:
    (first,) = write_rank(tmp_path, 1)
    copy = tmp_path / "copy.trace"
    copy.write_bytes(first.read_bytes())
    with pytest.raises(TraceSetError, match="is part 0 of rank tp0"):
        open_traceset([tmp_path])


def test_leading_parts_missing_is_a_note_not_an_error(tmp_path: Path) -> None:
    write_rank(tmp_path, 3, skip=(0,))
    with open_traceset([tmp_path]) as traces:
        rank = traces.rank()
        assert rank.header.first_pass == 4 and rank.pass_count == 8
        assert rank.pass_at(0).seq == 4
        assert any("starts at part 1" in note for note in traces.notes)


def test_runs_in_one_directory_do_not_mix(tmp_path: Path) -> None:
    write_rank(tmp_path, 2, run_id="run-a", tp=0, pid=7)
    write_rank(tmp_path, 2, run_id="run-a", tp=1, pid=8)
    write_rank(tmp_path, 1, run_id="run-b", tp=0, pid=9, start=5)
    with open_traceset([tmp_path]) as traces:
        assert [(r.key, [k.label for k in r.ranks]) for r in traces.runs] == [("run-a", ["tp0", "tp1"]),
                                                                           ("run-b", ["tp0"])]
        with pytest.raises(TraceSetError, match="2 runs .*choose one with --run"):
            traces.run()
        assert traces.run("run-b").rank().pass_count == PASSES_PER_PART
        assert traces.rank("1", run="run-a").label == "tp1"
        assert traces.rank("tp0", run="run-a").pass_count == 2 * PASSES_PER_PART
        with pytest.raises(TraceSetError, match="--rank tp5 names no rank of run run-a"):
            traces.rank("tp5", run="run-a")
        with pytest.raises(TraceSetError, match="has 2 ranks"):
            traces.rank(run="run-a")


@pytest.mark.parametrize("run_id", ["", "distinct"])
def test_two_runs_with_the_same_pid_do_not_mix(tmp_path: Path, run_id: str) -> None:
    """Without a run id the start time tells them apart; with one, the id (same start time here)."""
    write_rank(tmp_path / "one", 2, run_id=run_id and "run-1", pid=7, start=100)
    write_rank(tmp_path / "two", 2, run_id=run_id and "run-2", pid=7, start=100 if run_id else 200)
    with open_traceset([tmp_path / "one", tmp_path / "two"]) as traces:
        assert len(traces.runs) == 2
        assert [r.ranks[0].pass_count for r in traces.runs] == [8, 8]


def test_two_processes_claiming_one_rank_are_refused(tmp_path: Path) -> None:
    write_rank(tmp_path, 1, pid=7)
    write_rank(tmp_path, 2, pid=8, skip=(0,))  # part 1 of the same run and rank, from another process
    with pytest.raises(TraceSetError, match="from another process"):
        open_traceset([tmp_path])


def test_globs_directories_and_bad_paths(tmp_path: Path) -> None:
    write_rank(tmp_path, 2, tp=0, pid=7)
    write_rank(tmp_path, 2, tp=1, pid=8)
    with open_traceset([str(tmp_path / "*tp1*.trace")]) as traces:
        assert [r.label for r in traces.ranks] == ["tp1"]
    with open_traceset([tmp_path, tmp_path / "schedtrace-tp0-dp0-pid7.part000.trace"]) as traces:
        assert len(traces.files) == 4  # a file named twice is read once
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceNotFoundError, match="holds no"):
        open_traceset([tmp_path / "empty"])
    with pytest.raises(TraceNotFoundError, match="no trace file matches"):
        open_traceset([str(tmp_path / "*.nothing")])
    with pytest.raises(TraceSetError, match="more than 3 trace files"):
        open_traceset([tmp_path], max_files=3)


def test_a_torn_last_part_reads_its_prefix_at_a_global_offset(tmp_path: Path) -> None:
    write_rank(tmp_path, 1)
    header = builders.header(run_id="run-a", tp_rank=0, tp_size=2, pid=7, part=1, first_pass=PASSES_PER_PART)
    last = tmp_path / "schedtrace-tp0-dp0-pid7.part001.trace"
    writer = TraceWriter(last, header)
    writer.write_many(part_records(PASSES_PER_PART))
    writer.abandon()
    last.write_bytes(last.read_bytes()[:-3])  # the last pass is torn
    with open_traceset([tmp_path]) as traces:
        rank = traces.rank()
        assert rank.pass_count == 2 * PASSES_PER_PART - 1
        assert not rank.closed_cleanly
        list(rank.records())
        first_size = rank.parts[0].file_size
        assert rank.truncated_at is not None and rank.truncated_at > first_size


def test_rank_labels_name_the_parallel_layout() -> None:
    assert rank_label(builders.header(tp_rank=3, tp_size=8)) == "tp3"
    assert rank_label(builders.header(tp_rank=1, tp_size=2, dp_rank=1, dp_size=2)) == "dp1.tp1"
    assert rank_label(builders.header(tp_rank=0, pp_rank=1, pp_size=2)) == "pp1.tp0"


def test_ranks_missing_from_a_run_are_noted(tmp_path: Path) -> None:
    write_rank(tmp_path, 1, tp=0, pid=7)  # tp_size 2: tp1 is not there
    write_rank(tmp_path, 1, tp=0, pid=8, run_id="run-b")
    write_rank(tmp_path, 1, tp=1, pid=9, run_id="run-b")
    with open_traceset([tmp_path]) as traces:
        assert traces.notes == ()  # a single rank is what was asked for; run-b is complete
    (tmp_path / "schedtrace-tp0-dp0-pid7.part000.trace").unlink()
    for tp, pid in ((0, 10), (2, 11)):
        header = builders.header(run_id="run-c", tp_rank=tp, tp_size=4, pid=pid)
        write_trace(tmp_path / f"c{tp}.trace", header, part_records(0))
    with open_traceset([tmp_path]) as traces:
        assert traces.notes == ("run run-c: tp rank(s) 1, 3 of tp_size 4 (pp 0, dp 0) are not in the set",)


def test_a_damaged_middle_part_reads_on_past_its_gap_with_skip_damaged(tmp_path: Path) -> None:
    from schedtrace.tracer.contract.errors import TraceDamagedError
    from schedtrace.tracer.contract.framing import MARKER_SIZE

    write_rank(tmp_path, 1)
    middle = tmp_path / "schedtrace-tp0-dp0-pid7.part001.trace"
    writer = TraceWriter(middle, builders.header(run_id="run-a", tp_rank=0, tp_size=2, pid=7, part=1,
                                                 first_pass=PASSES_PER_PART), version=1)
    records = part_records(PASSES_PER_PART)
    ends = []
    for i in range(0, len(records), 2):  # one batch per arrival + pass
        writer.write_many(records[i:i + 2])
        ends.append(writer.size)
    writer.close(99)
    write_rank(tmp_path, 3, skip=(0, 1))
    data = bytearray(middle.read_bytes())
    data[ends[1] + MARKER_SIZE + 3] ^= 0x10  # inside the middle part's third batch: pass 6 and its arrival
    middle.write_bytes(bytes(data))

    with open_traceset([tmp_path]) as strict:
        with pytest.raises(TraceDamagedError):
            list(strict.rank().passes())
    with open_traceset([tmp_path], skip_damaged=True) as traces:
        rank = traces.rank()
        first_size = rank.parts[0].file_size
        (gap,) = rank.gaps
        assert (gap.start, gap.end, gap.lost) == (first_size + ends[1], first_size + ends[2], 2)
        assert [p.seq for p in rank.passes()] == [s for s in range(3 * PASSES_PER_PART) if s != 6]
        assert not rank.closed_cleanly
