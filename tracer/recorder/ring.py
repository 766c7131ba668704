"""Ring mode's memory: the last ``capacity`` bytes of records, encoded, oldest dropped first.

Writer thread only. Records are kept encoded (msgpack, as the file would hold
them), so ``capacity`` is what the window costs in memory and on disk, not a
guess at Python object sizes. They are kept before numbering: pass numbers
are given when a window is written, so the written parts number their passes
consecutively, as every trace does, and the gaps between windows are ``Loss``
records (reason ``ring``) counting the records that fell off the old end.
"""

from __future__ import annotations

from array import array
from collections import deque

import msgspec

from schedtrace.tracer.contract.format import encode_into
from schedtrace.tracer.contract.schema import Record

_decoder = msgspec.msgpack.Decoder(Record)


class _Chunk:
    """The records of one batch: their bytes, where each ends, and the first one still kept."""

    __slots__ = ("data", "ends", "first")

    def __init__(self, data: bytearray, ends: array) -> None:
        self.data, self.ends, self.first = data, ends, 0

    @property
    def start(self) -> int:
        return self.ends[self.first - 1] if self.first else 0

    @property
    def size(self) -> int:
        return len(self.data) - self.start

    def records(self) -> list[Record]:
        view = memoryview(self.data)
        start, out = self.start, []
        for end in self.ends[self.first:]:
            out.append(_decoder.decode(view[start:end]))
            start = end
        return out


class Ring:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0  # encoded bytes kept
        self.kept = 0  # records kept
        self.discarded = 0  # records dropped off the old end since the last take
        self._chunks: deque[_Chunk] = deque()

    def add(self, records: list[Record]) -> None:
        data, ends = bytearray(), array("I")  # 4 bytes per record beside its encoding
        for record in records:
            encode_into(record, data)
            ends.append(len(data))
        if not ends:
            return
        self._chunks.append(_Chunk(data, ends))
        self.size += len(data)
        self.kept += len(ends)
        self._trim()

    def _trim(self) -> None:
        chunks = self._chunks
        while self.size > self.capacity and chunks:
            chunk = chunks[0]
            before = chunk.size
            chunk.first += 1
            self.size -= before - chunk.size
            self.kept -= 1
            self.discarded += 1
            if chunk.first == len(chunk.ends):
                chunks.popleft()

    def take(self) -> tuple[list[Record], int]:
        """The kept records, oldest first, and how many were dropped before them; empties the ring."""
        records = [record for chunk in self._chunks for record in chunk.records()]
        discarded = self.discarded
        self._chunks.clear()
        self.size = self.kept = self.discarded = 0
        return records, discarded
