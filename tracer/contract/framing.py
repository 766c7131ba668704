"""Batch framing: the checksummed markers that make a trace checkable.

A framed trace is still a plain msgpack stream. Each batch the writer hands
the OS in one write starts with a fixed-size marker record::

    ["batch", records_before: u64, n_records: u32, n_bytes: u32, checksum: u64]

followed by ``n_bytes`` of records. ``records_before`` counts every record
written before the batch (the header is record 0), so when a damaged region
is skipped the next good marker says exactly how many records it held.
``checksum`` is xxh3-64 over the marker's own fields and then the batch's
bytes, seeded with the file's seed: a flipped bit in either fails it, and a
batch copied in from another trace never passes.

The first marker follows the header and covers it instead of a batch: it
has ``records_before`` 0, ``n_records`` 1, ``n_bytes`` 0, and its checksum
is seeded with the xxh3-64 of the header's bytes. That checksum is the
file's seed for every later marker. Its presence is what tells a reader the
file is framed; a v1 trace has none and reads as before.

A ``Gap`` describes one unreadable region, as the reader reports it.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

import msgspec
import xxhash

from schedtrace.tracer.contract.names import (FIRST_BATCH_WINDOW, MAX_BATCH_BYTES, MIN_RECORD_BYTES,  # noqa: F401
                                             SPLIT_BYTES)

MARKER_TAG: Final = "batch"
MARKER_PREFIX: Final = b"\x95\xa5batch\xcf"  # array of 5, "batch", then a uint64
# prefix, records_before, 0xce, n_records, 0xce, n_bytes, 0xcf, checksum (big-endian, as msgpack).
_LAYOUT: Final = struct.Struct(">8sQBIBIBQ")
MARKER_SIZE: Final = _LAYOUT.size  # 35
_HEAD_SIZE: Final = MARKER_SIZE - 8  # the bytes before the checksum value: covered by it, then the batch
_U32: Final = 0xCE
_U64: Final = 0xCF



class Marker(NamedTuple):
    offset: int  # where the marker starts
    records_before: int
    n_records: int
    n_bytes: int
    checksum: int

    @property
    def payload(self) -> int:
        """Offset of the batch's first record."""
        return self.offset + MARKER_SIZE

    @property
    def end(self) -> int:
        """Offset just past the batch (the next marker's offset)."""
        return self.offset + MARKER_SIZE + self.n_bytes


TORN: Final = "torn"  # read_marker: the bytes end inside what starts like a marker


def header_seed(header: bytes | memoryview) -> int:
    """The seed of the first marker's checksum: the header's own bytes."""
    return xxhash.xxh3_64_intdigest(header)


def checksum(head: bytes | memoryview, payload: bytes | memoryview, seed: int) -> int:
    """xxh3-64 of the marker fields, then the batch bytes, from ``seed``."""
    return xxhash.xxh3_64_intdigest(payload, xxhash.xxh3_64_intdigest(head, seed))


def marker_bytes(records_before: int, n_records: int, payload: bytes | memoryview, seed: int) -> bytes:
    head = _LAYOUT.pack(MARKER_PREFIX, records_before, _U32, n_records, _U32, len(payload), _U64, 0)[:_HEAD_SIZE]
    return head + checksum(head, payload, seed).to_bytes(8, "big")


def read_marker(data: bytes | memoryview, offset: int, limit: int) -> Marker | str | None:
    """The marker at ``offset``; ``TORN`` if the bytes end inside one; None if there is none."""
    available = limit - offset
    if available < MARKER_SIZE:
        partial = bytes(data[offset : offset + min(available, len(MARKER_PREFIX))])
        return TORN if available > 0 and MARKER_PREFIX.startswith(partial) else None
    prefix, before, t1, n_records, t2, n_bytes, t3, check = _LAYOUT.unpack_from(data, offset)
    if prefix != MARKER_PREFIX or t1 != _U32 or t2 != _U32 or t3 != _U64 or n_bytes > MAX_BATCH_BYTES:
        return None  # not a marker the writer makes: a claimed batch past the bound is not read or hashed
    return Marker(offset, before, n_records, n_bytes, check)


def marker_checks(view: memoryview, marker: Marker, seed: int) -> bool:
    """Whether the marker's checksum matches its fields and its batch's bytes."""
    with view[marker.offset : marker.offset + _HEAD_SIZE] as head, view[marker.payload : marker.end] as payload:
        return checksum(head, payload, seed) == marker.checksum


class Gap(msgspec.Struct, frozen=True, kw_only=True):
    """An unreadable region of a trace: bytes ``start``..``end`` could not be checked or parsed."""

    start: int  # first unreadable byte
    end: int  # first byte after it: the next good batch, or the end of the data
    lost: int | None  # records that were in it (None: unknown, a v1 trace or no later marker)
    reason: str  # what was wrong where reading stopped
    first_bad: int | None = None  # the first record inside it that does not parse or decode, if found
    # v2: passes after it, up to the next keyframe, that are lost with it (their deltas need a pass in it).
    orphans: int = 0

    def describe(self) -> str:
        lost = "records lost: unknown" if self.lost is None else f"{self.lost:,} records lost"
        after = f", and the {self.orphans:,} delta passes after it up to the next keyframe" if self.orphans else ""
        return f"{self.end - self.start:,} bytes unreadable at offset {self.start}–{self.end}, {lost}{after}"
