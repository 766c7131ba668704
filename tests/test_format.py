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
import msgspec
import pytest

from schedtrace.tracer.contract.errors import TraceFormatError, TraceNotFoundError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, encode, write_trace
from schedtrace.testing.builders import header, pass_record
from schedtrace.tracer.contract.keyframes import MAX_KEYFRAME_INTERVAL
from schedtrace.tracer.contract.schema import Arrival, KvSnapshot, Pass, PassDelta, WaitingReq


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


@pytest.mark.parametrize("cut", [1, 7, 25])  # inside the arrival, at its end + 5: inside the pass
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


# --- hostile v2 input -----------------------------------------------------------------------------------


def with_appended(tmp_path: Path, tail: list[bytes], passes: int = 3) -> tuple[Path, int]:
    """An unclosed v2 trace of ``passes`` passes with raw records appended (no checksum covers them)."""
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header())
    writer.write_many([a_pass(i) for i in range(passes)])
    writer.abandon()
    offset = path.stat().st_size
    with open(path, "ab") as f:
        for raw in tail:
            f.write(raw)
    return path, offset


def a_delta(seq: int, **fields) -> bytes:
    base = dict(seq=seq, dt_ns=1, dur_ns=1, repeat=1, idle_before=0, waiting_runs=[], waiting_new=[],
                running_runs=[], running_new=[], running_step=0, chunked=None, batch_is_full_in=False,
                kv=KvSnapshot(0, 0), req_slots_free=0, new_token_ratio=0.0, chunked_prefill_size=None,
                candidates=[], admitted=[], chunk=None, new_chunked_rid=None, batch_is_full_out=False)
    return encode(PassDelta(**(base | fields)))


@pytest.mark.parametrize("fields, reason", [
    ({"waiting_runs": [0, 10**9]}, "copies rows"),
    ({"waiting_runs": [0]}, "pairs"),
    ({"waiting_runs": [-1, 2]}, "new rows"),
    ({"running_runs": [0, 0]}, "count 0"),
    ({"waiting_new": [WaitingReq("x", 1, 0, 1, 0)]}, "unused"),
    ({"chunked": 5}, "had none"),
])
def test_a_delta_that_does_not_apply_is_a_format_error_naming_its_offset(tmp_path: Path, fields: dict,
                                                                          reason: str) -> None:
    path, offset = with_appended(tmp_path, [a_delta(3, **fields)])
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match=reason) as caught:
        list(reader.records())
    assert caught.value.offset == offset and str(path) in str(caught.value)


def test_rebuilt_lists_are_bounded_by_the_record_limit(tmp_path: Path) -> None:
    # each delta doubles the queue from a 3-row keyframe: a few bytes that would grow without bound
    rows = [WaitingReq(f"r{i}", 1, 0, 1, 0) for i in range(3)]
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, header())
    writer.write(msgspec.structs.replace(a_pass(0), waiting=rows))
    writer.abandon()
    size, tail = 3, []
    for seq in range(1, 40):
        tail.append(a_delta(seq, waiting_runs=[0, size, 0, size]))
        size *= 2
    with open(path, "ab") as f:
        f.write(b"".join(tail))
    with TraceReader(path, max_record_bytes=1 << 20) as reader, pytest.raises(TraceFormatError, match="grows past"):
        list(reader.records())


def test_a_delta_chain_longer_than_the_limit_is_refused(tmp_path: Path) -> None:
    path, _ = with_appended(tmp_path, [a_delta(seq) for seq in range(3, MAX_KEYFRAME_INTERVAL + 3)], passes=3)
    with TraceReader(path) as reader:
        assert reader.pass_count == MAX_KEYFRAME_INTERVAL + 3
        with pytest.raises(TraceFormatError, match="after its keyframe"):
            reader.pass_at(MAX_KEYFRAME_INTERVAL + 2)


def test_a_delta_in_a_v1_trace_and_a_bad_keyframe_index_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "v1.trace"
    writer = TraceWriter(path, header(), version=1)
    writer.write_many([a_pass(0)])
    writer.abandon()
    with open(path, "ab") as f:
        f.write(a_delta(1))
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="delta pass record in a v1 trace"):
        list(reader.records())
    bad = tmp_path / "v2.trace"
    writer = TraceWriter(bad, header())
    writer.write_many([a_pass(i) for i in range(20)])
    writer.keyframes.append(25)  # an index entry past the last pass
    writer.close(1)
    with pytest.raises(TraceFormatError, match="footer keyframe index"):
        TraceReader(bad)
    with TraceReader(bad, skip_damaged=True) as reader:  # read as not closed: the scan finds the keyframes
        assert list(reader.passes()) == [a_pass(i) for i in range(20)]
