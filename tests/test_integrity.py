"""Trace integrity (issue 12): checksummed batches, gaps, disk full, durability, checked footers and reports.

Each numbered defect of the issue has a test named after it. Files are real
files on disk; failures are injected only at the system-call boundary
(``FileOps``), never by replacing the reader or writer.
"""

from __future__ import annotations

import errno
import struct
from collections import Counter
from pathlib import Path

import msgpack
import msgspec
import pytest

from schedtrace.tracer.analysis.summary import summarize
from schedtrace.testing.builders import header, pass_record
from schedtrace.tracer.contract.codec import encode, offsets_from_bytes, offsets_to_bytes
from schedtrace.tracer.contract.errors import (
    ReportMismatchError,
    TraceDamagedError,
    TraceFormatError,
    TraceNotFoundError,
    TraceVersionError,
    TraceWriteError,
)
from schedtrace.tracer.contract.format import FileOps, TraceReader, TraceWriter, write_trace
from schedtrace.tracer.contract.framing import MARKER_SIZE, SPLIT_BYTES, marker_bytes, read_marker
from schedtrace.tracer.contract.report import Report, dump_report, load_report
from schedtrace.tracer.contract.report_check import check_report
from schedtrace.tracer.contract.schema import RECORD_TYPES, TAIL_PREFIX, TAIL_SIZE, Arrival, Finish, Footer, KvSnapshot, Pass
from schedtrace.testing.synthetic import generate

# The recordings written before framing: one shipped sample and the first fcfs one (traces/README.md).
SAMPLES = [Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace",
           Path(__file__).resolve().parent / "traces" / "v1-kv-pressure-fcfs.trace"]


def a_pass(seq: int, rid_len: int = 8) -> Pass:
    return pass_record(seq, t_ns=seq * 10, dur_ns=5, kv=KvSnapshot(available=100, evictable=0),
                       req_slots_free=4, new_token_ratio=0.5, new_chunked_rid="x" * rid_len)


def batches(n_batches: int, per_batch: int = 3, first_seq: int = 0) -> list[list]:
    """Batches of one arrival and ``per_batch - 1`` passes, numbered on."""
    out, seq = [], first_seq
    for b in range(n_batches):
        batch = [Arrival(b, f"r{b}", 10, 5)]
        for _ in range(per_batch - 1):
            batch.append(a_pass(seq))
            seq += 1
        out.append(batch)
    return out


def write_batches(path: Path, n_batches: int, *, per_batch: int = 3, close: bool = True) -> list[int]:
    """A framed v1 trace of ``batches(n_batches)``, one write each; returns the file size after each.

    v1 keeps every pass whole, so these tests see framing alone; v2's deltas
    and their gaps are tests/test_delta.py's.
    """
    writer = TraceWriter(path, header(), version=1)
    ends = []
    for batch in batches(n_batches, per_batch):
        writer.write_many(batch)
        ends.append(writer.size)
    writer.close(99) if close else writer.abandon()
    return ends


def damage_pass(path: Path, n: int, at: int, change) -> int:
    """Set the byte ``at`` bytes into pass ``n``'s record to ``change(byte)``; returns the pass's offset."""
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[n]
    data = bytearray(path.read_bytes())
    data[offset + at] = change(data[offset + at])
    path.write_bytes(bytes(data))
    return offset


def read_all(reader: TraceReader) -> list[tuple[int, object]]:
    return list(reader.records())


def tags_of(records) -> Counter:
    return Counter(record.__struct_config__.tag for _, record in records)


# --- framing ------------------------------------------------------------------------


def test_a_framed_trace_is_still_a_plain_msgpack_stream(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_batches(path, 4)
    objects = list(msgpack.Unpacker(open(path, "rb"), raw=False))
    assert [o[0] for o in objects].count("batch") == 1 + 4 + 1  # header's, one per batch, the footer's
    with TraceReader(path) as reader:
        assert reader.framed and reader.closed_cleanly and reader.gaps == []
        records = read_all(reader)
        assert reader.pass_count == 8
    plain = [o for o in objects if o[0] not in ("batch", "footer", "tail")]
    assert [msgspec.msgpack.decode(msgspec.msgpack.encode(r)) for _, r in records] == plain


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_v1_samples_read_exactly_as_a_plain_decoder_sees_them(sample: Path) -> None:
    objects = list(msgpack.Unpacker(open(sample, "rb"), raw=False, strict_map_key=False))
    with TraceReader(sample) as reader:
        assert not reader.framed and reader.closed_cleanly and reader.gaps == []
        records = read_all(reader)
        assert reader.pass_count == reader.footer.counts["pass"]
        assert [p.seq for p in reader.passes()] == list(range(reader.pass_count))
    plain = [msgspec.msgpack.decode(msgpack.packb(o), type=RECORD_TYPES[o[0]])
             for o in objects if o[0] not in ("footer", "tail")]
    assert [r for _, r in records] == plain


def test_a_large_write_is_cut_into_several_checked_batches(tmp_path: Path) -> None:
    records = [a_pass(n, rid_len=2000) for n in range(600)]  # about 1.2 MB: several batches, one write
    path = write_trace(tmp_path / "t.trace", header(), records)
    data = path.read_bytes()
    markers = [m for m in (read_marker(data, at, len(data)) for at in _find_all(data, b"\x95\xa5batch")) if m]
    assert len(markers) >= 1 + 1.2e6 // SPLIT_BYTES + 1
    assert all(m.n_bytes <= SPLIT_BYTES + 3000 for m in markers)
    with TraceReader(path) as reader:
        assert [p.seq for p in reader.passes()] == list(range(600))


def _find_all(data: bytes, needle: bytes) -> list[int]:
    found, at = [], data.find(needle)
    while at >= 0:
        found.append(at)
        at = data.find(needle, at + 1)
    return found


def test_a_gap_says_how_many_bytes_and_records_it_cost(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    ends = write_batches(path, 5)
    data = bytearray(path.read_bytes())
    data[ends[1] + MARKER_SIZE + 3] ^= 0x10  # a bit inside batch 2's first record
    path.write_bytes(bytes(data))
    with TraceReader(path, skip_damaged=True) as reader:
        (gap,) = reader.gaps
        assert (gap.start, gap.end, gap.lost) == (ends[1], ends[2], 3)
        assert gap.describe() == f"{ends[2] - ends[1]:,} bytes unreadable at offset {ends[1]}–{ends[2]}, 3 records lost"
        assert not reader.closed_cleanly
        rids = [r.rid for _, r in reader.records() if isinstance(r, Arrival)]
        assert rids == ["r0", "r1", "r3", "r4"]  # nothing after the gap is dropped
        assert reader.pass_count == 10 and [p.seq for p in reader.passes()] == [0, 1, 2, 3, 6, 7, 8, 9]
        with pytest.raises(TraceDamagedError) as caught:
            reader.pass_at(4)
        assert caught.value.gap == gap


def test_strict_reading_stops_at_the_first_gap_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_batches(path, 4)
    offset = damage_pass(path, 3, 0, lambda byte: 0xC1)
    with TraceReader(path) as reader:
        seen = []
        with pytest.raises(TraceDamagedError) as caught:
            for _, record in reader.records():
                seen.append(record)
        assert caught.value.offset == offset and "records lost" in str(caught.value)
        assert [r.seq for r in seen if isinstance(r, Pass)] == [0, 1]


def test_unframed_bytes_after_the_last_batch_read_unchecked(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_batches(path, 1, close=False)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(encode(a_pass(2)))
    with TraceReader(path) as reader:
        assert reader.unchecked_from == size and reader.gaps == []
        assert [p.seq for p in reader.passes()] == [0, 1, 2]


# --- 1: disk full ---------------------------------------------------------------------


class FullDisk(FileOps):
    """Real writes until ``room`` bytes have gone to the file, then ENOSPC (after a partial write)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.truncate_fails = 0

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = super().pwrite(fd, data[: self.room], offset)
        self.room -= n
        return n

    def truncate(self, fd: int, size: int) -> None:
        if self.truncate_fails:
            self.truncate_fails -= 1
            raise OSError(errno.EIO, "Input/output error")
        super().truncate(fd, size)


def write_numbered(writer: TraceWriter, batch: list) -> None:
    """Number passes as the writer thread must: consecutive over passes in the file."""
    seq = writer.passes
    for record in batch:
        if isinstance(record, Pass):
            record.seq = seq
            seq += 1
    writer.write_many(batch)


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
def test_1_disk_full_keeps_the_file_readable_and_the_footer_true(tmp_path: Path, framed: bool) -> None:
    disk = FullDisk(room=10**9)
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header(), framed=framed, ops=disk)
    for batch in batches(20):
        write_numbered(writer, batch)
    good_size = writer.size
    disk.room = 100  # the next batch gets 100 bytes in, then the disk is full
    with pytest.raises(TraceWriteError) as caught:
        write_numbered(writer, batches(1)[0])
    failure = caught.value
    assert isinstance(failure, OSError) and failure.errno == errno.ENOSPC
    assert (failure.records_written, failure.records_lost) == (0, 3)
    assert path.stat().st_size == writer.size == good_size  # the partial batch is cut off
    with TraceReader(path) as reader:  # readable while still open
        assert reader.truncated_at is None and reader.gaps == []
        assert [p.seq for p in reader.passes()] == list(range(40))
    with pytest.raises(TraceWriteError):  # the footer does not fit either
        writer.close(99)
    writer.abandon()
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly and reader.pass_count == 40
        assert [r.rid for _, r in reader.records() if isinstance(r, Arrival)] == [f"r{b}" for b in range(20)]


def test_1_after_disk_full_the_footer_counts_what_is_on_disk(tmp_path: Path) -> None:
    disk = FullDisk(room=10**9)
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header(), ops=disk)
    lost = 0
    for n, batch in enumerate(batches(30)):
        if n in (7, 19):
            disk.room = 37  # a partial write, then ENOSPC
        if n == 19:
            disk.truncate_fails = 1  # and the cut back fails once: retried before the next write
        try:
            write_numbered(writer, batch)
        except TraceWriteError as exc:
            lost += exc.records_lost
            disk.room = 10**9  # space comes back
    writer.close(99)
    assert lost == 6
    with TraceReader(path) as reader:
        assert reader.closed_cleanly
        records = read_all(reader)
        counts = reader.footer.counts
        assert {tag: counts[tag] for tag in tags_of(records)} == tags_of(records)
        assert len(records) == 1 + 30 * 3 - lost
        assert reader.pass_count == counts["pass"] == 56
        assert [p.seq for p in reader.passes()] == list(range(56))


def test_1_a_large_write_keeps_its_whole_batches_when_the_disk_fills(tmp_path: Path) -> None:
    disk = FullDisk(room=10**9)
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header(), ops=disk)
    records = [a_pass(n, rid_len=2000) for n in range(400)]  # about 3 batches in one write
    disk.room = SPLIT_BYTES + SPLIT_BYTES // 2
    with pytest.raises(TraceWriteError) as caught:
        writer.write_many(records)
    kept = caught.value.records_written
    assert 0 < kept < 400 and kept + caught.value.records_lost == 400
    with TraceReader(path) as reader:
        assert reader.gaps == [] and reader.truncated_at is None
        assert [p.seq for p in reader.passes()] == list(range(kept))


# --- durability -----------------------------------------------------------------------


class Spy(FileOps):
    """Real system calls, and the order they were made in."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        self.calls.append("write")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self.calls.append("fsync")
        super().fsync(fd)


def test_durability_one_write_per_batch_fsync_on_the_interval_and_around_the_tail(tmp_path: Path) -> None:
    now = [0.0]
    spy = Spy()
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header(), fsync_every_s=1.0, ops=spy, clock=lambda: now[0])
    assert spy.calls == ["write"]  # the header and its marker: one write, no sync yet
    for t, batch in zip((0.3, 0.6, 1.1, 1.5, 2.4), batches(5)):
        now[0] = t
        writer.write_many(batch)
        with TraceReader(path) as reader:  # each batch is in the file when write_many returns
            assert reader.gaps == [] and reader.pass_count == writer.passes
    assert spy.calls == ["write", "write", "write", "write", "fsync", "write", "write", "fsync"]
    spy.calls.clear()
    writer.close(99)
    assert spy.calls == ["write", "fsync", "write", "fsync"]  # footer, sync, tail, sync


def test_durability_can_be_turned_off_between_closes(tmp_path: Path) -> None:
    spy = Spy()
    now = [0.0]
    writer = TraceWriter(tmp_path / "t.trace", header(), fsync_every_s=None, ops=spy, clock=lambda: now[0])
    for batch in batches(3):
        now[0] += 10
        writer.write_many(batch)
    assert "fsync" not in spy.calls
    writer.close(1)
    assert spy.calls.count("fsync") == 2


# --- 2: a corrupt record inside a closed file -------------------------------------------------


def test_2_a_corrupt_record_in_a_closed_framed_file_is_not_clean_and_not_silent(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_batches(path, 20)
    damage_pass(path, 25, 10, lambda byte: byte ^ 0x01)
    with TraceReader(path) as reader:
        assert reader.footer is not None and not reader.closed_cleanly
        with pytest.raises(TraceDamagedError):
            list(reader.records())
    with TraceReader(path, skip_damaged=True) as reader:
        assert reader.pass_count == 40
        read = [p.seq for p in reader.passes()]
        assert read == [n for n in range(40) if n not in (24, 25)] and reader.gaps[0].lost == 3


def test_2_a_record_running_past_the_data_in_a_closed_v1_file_is_a_gap(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [r for b in batches(20) for r in b], framed=False)
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[10]
    data = bytearray(path.read_bytes())
    data[offset : offset + 5] = b"\xdb\x7f\xff\xff\xff"  # a str32 that claims 2 GiB
    path.write_bytes(bytes(data))
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly  # it used to say "closed cleanly" and stop at pass 10
        with pytest.raises(TraceDamagedError) as caught:
            list(reader.records())
        assert caught.value.offset == offset
    with TraceReader(path, skip_damaged=True) as reader:
        passes = [r.seq for _, r in reader.records() if isinstance(r, Pass)]
        assert passes == [n for n in range(40) if n != 10]  # resumed at the next indexed pass
        assert reader.gaps[0].lost is None


# --- 3: the footer index --------------------------------------------------------------------


def forge_footer(source: Path, change) -> Path:
    """A copy of ``source`` whose footer index is ``change(index bytes)``, re-sealed as a writer would."""
    data = source.read_bytes()
    footer_at = int.from_bytes(data[-8:], "big")
    footer = msgspec.msgpack.decode(data[footer_at:-TAIL_SIZE], type=Footer)
    footer.pass_offsets = change(footer.pass_offsets)
    encoded = msgspec.msgpack.encode(footer)
    marker = read_marker(data, footer_at - MARKER_SIZE, footer_at)
    with TraceReader(source) as reader:
        framed, seed = reader.framed, reader._seed
    if framed:
        head = marker_bytes(marker.records_before, 1, encoded, seed)
        body = data[: footer_at - MARKER_SIZE] + head + encoded
    else:
        body = data[:footer_at] + encoded
    forged = source.with_name("forged-" + source.name)
    forged.write_bytes(body + TAIL_PREFIX + footer_at.to_bytes(8, "big"))
    return forged


def _index(change):
    return lambda raw: change(offsets_from_bytes(raw))


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
@pytest.mark.parametrize("damage, message", [
    (_index(lambda o: offsets_to_bytes(o[:3] + o[4:5] + o[3:4] + o[5:])), "entry 4 is not after entry 3"),
    (_index(lambda o: offsets_to_bytes(o[:3] + o[2:3] + o[4:])), "entry 3 is not after entry 2"),
    (lambda raw: raw[:-3], "not whole 8-byte entries"),
    (_index(lambda o: offsets_to_bytes(o[:-1] + type(o)("Q", [2**64 - 1]))), "entry 9 points outside the data"),
    (_index(lambda o: offsets_to_bytes(o[:-1])), "counts 10 pass records but indexes 9"),
])
def test_3_a_bad_footer_index_is_one_clear_error(tmp_path: Path, framed: bool, damage, message: str) -> None:
    path = forge_footer(write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(10)], framed=framed),
                        damage)
    with pytest.raises(TraceFormatError, match=message) as caught:
        TraceReader(path)
    assert 0 <= caught.value.offset < path.stat().st_size
    assert "18446744073709551615" not in str(caught.value)


def test_3_an_index_entry_that_points_at_another_pass_is_refused(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [*(a_pass(n) for n in range(10)), Arrival(0, "late", 1, 1)],
                       framed=False)
    with TraceReader(path) as reader:
        late = [offset for offset, r in reader.records() if isinstance(r, Arrival)][0]
    # In order, the right length, but shifted from entry 5 on: entry 5 is pass 6's record.
    shifted = forge_footer(path, _index(lambda o: offsets_to_bytes(o[:5] + o[6:] + type(o)("Q", [late]))))
    with TraceReader(shifted) as reader:
        assert reader.pass_at(4).seq == 4
        with pytest.raises(TraceFormatError, match="entry 5 points at pass 6, expected 5"):
            reader.pass_at(5)
        with pytest.raises(TraceFormatError, match="entry 9 does not point at a pass"):
            reader.pass_at(9)
    inside = forge_footer(path, _index(lambda o: offsets_to_bytes(o[:5] + type(o)("Q", [o[5] + 1]) + o[6:])))
    with TraceReader(inside) as reader, pytest.raises(TraceFormatError) as caught:
        reader.pass_at(5)  # one byte into pass 5's record
    assert 0 <= caught.value.offset < inside.stat().st_size


# --- 4: header first_pass ---------------------------------------------------------------------


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "unclosed"])
def test_4_a_header_first_pass_that_disagrees_with_the_passes_is_an_error(tmp_path: Path, closed: bool) -> None:
    path = tmp_path / "t.trace"
    source = tmp_path / "src.trace"
    generate(source, 400, seed=3)
    with TraceReader(source) as reader:
        records = [r for _, r in reader.records()][1:]
    writer = TraceWriter(path, header(first_pass=7, server_args=reader.header.server_args))
    writer.write_many(records)
    writer.close(1) if closed else writer.abandon()
    with TraceReader(path) as reader:
        with pytest.raises(TraceFormatError, match="first_pass"):
            summarize(reader, stall_passes=5)  # used to raise IndexError or name the wrong onset
    with TraceReader(path) as reader:
        with pytest.raises(TraceFormatError, match="first_pass"):
            reader.pass_at(0)


def test_4_pass_numbers_follow_the_header_in_a_later_part(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", header(part=1, first_pass=100),
                       [a_pass(100 + n) for n in range(5)])
    with TraceReader(path) as reader:
        assert [reader.pass_at(n).seq for n in range(5)] == [100, 101, 102, 103, 104]
        assert summarize(reader)["pass_records"] == 5


# --- 7: reports ---------------------------------------------------------------------------------


def a_report(passes: int = 5, **fields) -> Report:
    report = generate_report_for(passes)
    return msgspec.structs.replace(report, **fields)


def generate_report_for(passes: int) -> Report:
    from schedtrace.tracer.contract.report import Fidelity

    return Report(trace="t.trace", sglang_version="0.5.23", trace_sglang_version="0.5.23", old="stock",
                  new="fixed", passes=passes, fidelity=Fidelity(arm="stock", matched=passes, total=passes),
                  divergences=[], stalls={"stock": [], "fixed": []}, errors={"stock": [], "fixed": []})


def test_7_a_directory_is_not_a_report(tmp_path: Path) -> None:
    with pytest.raises(TraceNotFoundError, match="is a directory"):
        load_report(tmp_path)


def test_7_a_report_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(dump_report(a_report()))
    assert load_report(path).passes == 5
    with pytest.raises(TraceFormatError, match="limit"):
        load_report(path, max_bytes=path.stat().st_size - 1)


def test_7_a_newer_report_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(dump_report(a_report(version=999)))
    with pytest.raises(TraceVersionError, match="999"):
        load_report(path)


def test_7_report_pass_numbers_are_checked_against_the_trace(tmp_path: Path) -> None:
    from schedtrace.tracer.contract.report import ArmError, Stall

    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(5)])
    with TraceReader(path) as reader:
        check_report(a_report(), reader, "r.json")
        check_report(a_report(errors={"stock": [ArmError(pass_=-1, error="x")], "fixed": []}), reader, "r.json")
        bad = a_report(stalls={"stock": [Stall(start_pass=3, end_pass=70, passes=68, head_rid=None)], "fixed": []})
        with pytest.raises(ReportMismatchError, match="stock stall end at pass 70"):
            check_report(bad, reader, "r.json")
        with pytest.raises(ReportMismatchError, match="replayed 9 passes"):
            check_report(a_report(passes=9), reader, "r.json")


def test_7_a_report_carrying_a_fingerprint_must_match_the_trace(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(5)])
    with TraceReader(path) as reader:
        print_ = reader.fingerprint()
        base = a_report()
        check_report(msgspec.structs.replace(base, trace_fingerprint=print_), reader, "r.json")
        with pytest.raises(ReportMismatchError, match="fingerprints differ"):
            check_report(msgspec.structs.replace(base, trace_fingerprint="blake2b:00"), reader, "r.json")
    with TraceReader(path) as again:
        assert again.fingerprint() == print_  # the same bytes name the same trace
    with open(path, "ab") as file:
        file.write(b"\x00")
    with TraceReader(path, skip_damaged=True) as changed:
        assert changed.fingerprint() != print_


# --- 9: torn tails and concatenated files --------------------------------------------------------


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
def test_9_a_torn_tail_never_yields_the_footer_as_data(tmp_path: Path, framed: bool) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(6)], framed=framed)
    path.write_bytes(path.read_bytes()[:-5])
    with TraceReader(path) as reader:
        records = read_all(reader)
        assert not reader.closed_cleanly and reader.truncated_at is not None
        assert not any(isinstance(r, Footer) for _, r in records)
        assert [p.seq for p in reader.passes()] == list(range(6))


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
def test_9_a_closed_file_concatenated_with_itself_does_not_read_as_clean(tmp_path: Path, framed: bool) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(6)], framed=framed)
    path.write_bytes(path.read_bytes() * 2)
    with pytest.raises(TraceFormatError, match="after the footer"):
        TraceReader(path)


def test_9_an_unclosed_file_concatenated_with_itself_reads_once_and_reports_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "t.trace"
    write_batches(path, 4, close=False)
    once = path.read_bytes()
    path.write_bytes(once * 2)
    with TraceReader(path) as reader, pytest.raises(TraceDamagedError):
        list(reader.records())
    with TraceReader(path, skip_damaged=True) as reader:
        rids = [r.rid for _, r in reader.records() if isinstance(r, (Arrival, Finish))]
        assert rids == ["r0", "r1", "r2", "r3"]
        assert [(g.start, g.end) for g in reader.gaps] == [(len(once), 2 * len(once))]


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
def test_9_a_tail_that_points_at_data_is_not_trusted(tmp_path: Path, framed: bool) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(6)], framed=framed)
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[2]
    data = bytearray(path.read_bytes())
    data[-8:] = struct.pack(">Q", offset)
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="footer") as caught:
        TraceReader(path)
    assert 0 <= caught.value.offset < len(data)


def test_a_damaged_header_is_refused(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(n) for n in range(3)])
    data = bytearray(path.read_bytes())
    data[data.index(b"test-host")] = ord("b")  # still a valid header, but not the one written
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="header fails its checksum"):
        TraceReader(path)
    with TraceReader(write_trace(tmp_path / "u.trace", header(), [a_pass(n) for n in range(3)])) as reader:
        header_end = reader._data_start - MARKER_SIZE
    data = bytearray((tmp_path / "u.trace").read_bytes())
    data[header_end] = 0x94  # the header's own marker is no longer one; later markers remain
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="not the one that checks it"):
        TraceReader(path)
