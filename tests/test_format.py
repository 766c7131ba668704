"""Reader/writer robustness: torn tails, corrupt bytes, hostile sizes.

Every case runs on a v2 trace (the writer's default: framed, passes between
keyframes written as deltas) and on a v1 trace (no batch markers): bytes
appended after the last batch read as v1 does. tests/test_delta.py holds the
cases about keyframes and deltas themselves.
"""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import pytest

from schedtrace.tracer.contract.errors import TraceFormatError, TraceNotFoundError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, encode, write_trace
from schedtrace.tracer.contract.builders import header, pass_record
from schedtrace.tracer.contract.schema import Arrival, KvSnapshot, Pass


def a_pass(seq: int) -> Pass:
    return pass_record(seq, t_ns=seq * 10, dur_ns=5, kv=KvSnapshot(available=100, evictable=0), req_slots_free=4,
                       new_token_ratio=0.5)


@pytest.fixture(params=[True, False], ids=["v2", "v1"])
def framed(request: pytest.FixtureRequest) -> bool:
    return request.param


def unclosed_trace(path: Path, n: int, framed: bool = True) -> list[int]:
    """n passes interleaved with arrivals, no footer; returns record end offsets."""
    writer = TraceWriter(path, header(), framed=framed)
    ends = [writer.size]
    for i in range(n):
        writer.write_many([Arrival(i, f"r{i}", 10 + i, 5), a_pass(i)])
        ends.append(writer.size)
    writer.abandon()
    return ends


def test_clean_roundtrip(tmp_path: Path, framed: bool) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(i) for i in range(5)], end_t_ns=99, framed=framed)
    with TraceReader(path) as reader:
        assert reader.closed_cleanly and reader.truncated_at is None
        assert [p.seq for p in reader.passes()] == [0, 1, 2, 3, 4]
        assert reader.pass_at(3) == a_pass(3)


@pytest.mark.parametrize("cut", [1, 7, 20])
def test_truncated_file_reads_its_prefix(tmp_path: Path, cut: int, framed: bool) -> None:
    path = tmp_path / "t.trace"
    ends = unclosed_trace(path, 10, framed)
    data = path.read_bytes()
    torn_at = ends[-2]  # the last pair of records starts here
    path.write_bytes(data[: torn_at + cut])
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly
        records = [r for _, r in reader.records()]
        assert reader.truncated_at is not None and reader.truncated_at >= torn_at
        assert reader.pass_count == 9
        assert [r.rid for r in records if isinstance(r, Arrival)][:9] == [f"r{i}" for i in range(9)]


def test_corrupt_bytes_name_the_offset(tmp_path: Path, framed: bool) -> None:
    path = tmp_path / "t.trace"
    ends = unclosed_trace(path, 4, framed)
    data = bytearray(path.read_bytes())
    bad_at = ends[2]
    data[bad_at] = 0xC1  # never valid in msgpack
    path.write_bytes(bytes(data))
    with TraceReader(path) as reader, pytest.raises(TraceFormatError) as caught:
        list(reader.records())
    assert caught.value.offset == bad_at
    assert str(bad_at) in str(caught.value) and str(path) in str(caught.value)


def test_wrong_field_type_is_a_format_error(tmp_path: Path, framed: bool) -> None:
    path = tmp_path / "t.trace"
    unclosed_trace(path, 1, framed)
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(msgpack.packb(["arrive", "not-an-int", "r", 1, 2]))
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match=f"offset {offset}: bad 'arrive'"):
        list(reader.records())


@pytest.mark.parametrize(
    "hostile",
    [
        b"\xdd\xff\xff\xff\xff",  # array32 declaring 4 billion elements
        b"\x92\xa4pass\xdb\xff\xff\xff\xf0",  # str32 declaring ~4 GiB
        b"\x92\xa4pass\xc6\x7f\xff\xff\xff",  # bin32 declaring 2 GiB
        b"\x92\xa4pass\xdf\xff\xff\xff\xff",  # map32 declaring 4 billion pairs
    ],
)
def test_hostile_sizes_are_bounded(tmp_path: Path, hostile: bytes, framed: bool) -> None:
    path = tmp_path / "t.trace"
    unclosed_trace(path, 2, framed)
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(hostile + b"\x00" * 64)
    with TraceReader(path, max_record_bytes=2 << 20) as reader:
        try:
            records = [r for _, r in reader.records()]
        except TraceFormatError as exc:
            assert exc.offset == offset
        else:  # a declared size past the end of the file is a torn tail
            assert reader.truncated_at == offset
            assert len(records) == 5  # header + 2 arrivals + 2 passes


def test_record_over_the_limit(tmp_path: Path, framed: bool) -> None:
    path = tmp_path / "t.trace"
    unclosed_trace(path, 1, framed)
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(encode(Arrival(0, "x" * (3 << 20), 1, 1)))
    with TraceReader(path, max_record_bytes=2 << 20) as reader, pytest.raises(TraceFormatError, match="limit"):
        list(reader.records())
    assert offset > 0


def test_tail_pointing_outside_the_file(tmp_path: Path, framed: bool) -> None:
    path = write_trace(tmp_path / "t.trace", header(), [a_pass(0)], framed=framed)
    data = bytearray(path.read_bytes())
    data[-8:] = struct.pack(">Q", 10**12)
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="tail points outside"):
        TraceReader(path)


def test_not_a_trace_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.trace"
    bad.write_bytes(msgpack.packb(["hello", 1]))
    with pytest.raises(TraceFormatError, match="expected a header"):
        TraceReader(bad)
    (tmp_path / "empty.trace").write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty"):
        TraceReader(tmp_path / "empty.trace")
    with pytest.raises(TraceNotFoundError):
        TraceReader(tmp_path / "nope.trace")


def test_unknown_record_is_skipped_and_counted(tmp_path: Path, framed: bool) -> None:
    path = tmp_path / "t.trace"
    unclosed_trace(path, 1, framed)
    with open(path, "ab") as f:
        f.write(msgpack.packb(["from_the_future", 1, 2]))
        f.write(encode(a_pass(1)))
    with TraceReader(path) as reader:
        assert reader.pass_count == 2
        list(reader.records())
        assert reader.unknown_records == {"from_the_future": 1}
