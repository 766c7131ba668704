"""Ring mode's memory: the last ``capacity`` bytes of records, encoded as format v2, oldest dropped first.

Writer thread only. Records are kept encoded as a v2 file would hold them (a
pass between keyframes as a delta against the pass before it, keyframes.py),
so ``capacity`` is what the window costs in memory, not a guess at Python
object sizes, and a MiB holds as many passes as a MiB of trace file.

The ring is a queue of segments, each one keyframe and the deltas that need
it (and the events between them). The old end drops one event at a time, but
a keyframe only with the rest of its segment: the oldest pass kept is always
a keyframe, so a window decodes on its own. Segments end where the encoder
writes a keyframe (keyframes.py), and at the latest (the next pass made a
keyframe) once a segment holds ``capacity / SEGMENTS`` bytes or
``KEYFRAMES_PER_SEGMENT`` times its keyframe's, whichever is more: dropping
whole segments costs the window at most that (a keyframe larger than
``capacity / SEGMENTS`` has deltas after it, or the ring would hold v1).

Records are kept before numbering: pass numbers are given when a window is
written, so the written parts number their passes consecutively, as every
trace does, and the gaps between windows are ``Loss`` records (reason
``ring``) counting the records that fell off the old end.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Final

import msgspec

from schedtrace.tracer.contract.delta import rebuild
from schedtrace.tracer.contract.format import encode_into
from schedtrace.tracer.contract.keyframes import PassEncoder
from schedtrace.tracer.contract.schema import Pass, PassDelta, Record

SEGMENTS: Final = 16  # a segment is cut at 1/SEGMENTS of the ring ...
KEYFRAMES_PER_SEGMENT: Final = 4  # ... or at this many times its keyframe's bytes, whichever is more

_decoder = msgspec.msgpack.Decoder(Record)


class _Segment:
    """Encoded records: their bytes, where each ends, the first one still kept, and where its keyframe is."""

    __slots__ = ("data", "ends", "first", "keyframe", "limit")

    def __init__(self, limit: int) -> None:
        self.data, self.ends, self.first = bytearray(), array("I"), 0  # 4 bytes per record beside its encoding
        self.keyframe: int | None = None  # index of its one keyframe (the events before it stand alone)
        self.limit = limit  # bytes at which the next record starts a new segment

    def append(self, encoded: bytes | bytearray) -> None:
        self.data += encoded
        self.ends.append(len(self.data))

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
        self.segment_bytes = max(1, capacity // SEGMENTS)
        self.size = 0  # encoded bytes kept
        self.kept = 0  # records kept
        self.discarded = 0  # records dropped off the old end since the last take
        self._segments: deque[_Segment] = deque()
        self._passes = PassEncoder()
        self._seq = 0  # the ring's own pass numbers: a delta follows the pass numbered one before it
        self._scratch = bytearray()

    def add(self, records: list[Record]) -> None:
        scratch, segments = self._scratch, self._segments
        for record in records:
            segment = segments[-1] if segments else None
            if segment is None or segment.size >= segment.limit:
                segment = self._cut()
            scratch.clear()
            if type(record) is Pass:
                record.seq, self._seq = self._seq, self._seq + 1
                written = self._passes.encode_into(record, scratch)
                if written is None:  # too large for any file: kept whole, the file's writer leaves it out
                    encode_into(record, scratch)
                elif written and segment.keyframe is not None:
                    segment = self._cut(reset=False)  # a keyframe of the encoder's own starts a segment too
                if segment.keyframe is None:
                    segment.keyframe = len(segment.ends)
                    segment.limit = max(self.segment_bytes, KEYFRAMES_PER_SEGMENT * len(scratch))
            else:
                encode_into(record, scratch)
            segment.append(scratch)
            self.size += len(scratch)
            self.kept += 1
        self._trim()

    def _cut(self, reset: bool = True) -> _Segment:
        """A new segment at the new end; with ``reset``, its first pass is made a keyframe."""
        if reset:
            self._passes.reset()
        segment = _Segment(self.segment_bytes)
        self._segments.append(segment)
        return segment

    def _trim(self) -> None:
        segments = self._segments
        while self.size > self.capacity and segments:
            segment = segments[0]
            before = segment.size
            if segment.keyframe is None or segment.first < segment.keyframe:
                dropped = 1  # an event before the keyframe: nothing needs it
            else:
                dropped = len(segment.ends) - segment.first  # the keyframe, with every delta on it
            segment.first += dropped
            self.size -= before - segment.size
            self.kept -= dropped
            self.discarded += dropped
            if segment.first == len(segment.ends):
                segments.popleft()
                if not segments:
                    self._passes.reset()  # the pass the next delta would need is gone

    def take(self) -> tuple[list[Record], int]:
        """The kept records decoded, deltas rebuilt into passes, oldest first, and how many were dropped
        before them; empties the ring."""
        out: list[Record] = []
        previous: Pass | None = None
        for segment in self._segments:
            for record in segment.records():
                if type(record) is PassDelta:
                    assert previous is not None  # a segment's deltas follow its keyframe
                    record = rebuild(previous, record, max_rows=self.capacity)  # a row is more than a byte
                if type(record) is Pass:
                    previous = record
                out.append(record)
        discarded = self.discarded
        self._segments.clear()
        self._passes.reset()
        self.size = self.kept = self.discarded = 0
        return out, discarded
