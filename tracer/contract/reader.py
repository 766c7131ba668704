"""Read one trace file: streaming, by pass number, checked, bounded.

Untrusted input: no record may exceed ``max_record_bytes``, every failure
is a ``TraceFormatError`` naming the file and a byte offset inside it, and
nothing read is trusted before it is checked. A framed trace (framing.py)
is checked against its batch checksums once, on first need (a hash of the
data, no parsing); a v1 trace is stepped over record by record instead.

Damaged regions become ``gaps``. By default reading stops at the first one
with a ``TraceDamagedError`` (records before it are returned), and a footer
or tail that fails its checks refuses the file; ``skip_damaged=True`` reads
on past every gap, reads a file whose footer fails as one that was not
closed, and ``gaps`` lists what was lost. ``closed_cleanly`` is true only
for a file with a checked footer and no gap. A record that is whole but
cannot be used (it fails the schema, its delta does not apply, its seq is
not its place) is found when it is read: strict reading raises, and
``skip_damaged`` makes it a gap of its own (one record lost) and reads on,
so ``gaps`` can grow as the file is read. Pass numbers are checked
against ``Pass.seq``: ``pass_at(n)`` returns the pass whose seq is
``header.first_pass + n``, or raises.

A v2 trace's delta passes are rebuilt here (pass_chain.py): ``records()``,
``record_at``, ``pass_at`` and ``passes()`` return whole ``Pass`` records,
as for v1. Passes that share no change share their row objects: treat
returned records as read-only.
"""

from __future__ import annotations

import mmap
import os
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator
from operator import attrgetter
from typing import Final

import msgspec

from schedtrace.tracer.contract.codec import (ARRAYS, DATA_DECODERS, DECODERS, DELTA_TAG, MAX_RECORD_BYTES,
                                             PASS_TAGS, V1_DATA_DECODERS, peek_tag)
from schedtrace.tracer.contract.errors import TraceDamagedError, TraceFormatError, TraceNotFoundError, TraceVersionError
from schedtrace.tracer.contract.fingerprint import file_fingerprint
from schedtrace.tracer.contract.footer import read_footer
from schedtrace.tracer.contract.frames import BadBytes, frame_end, frames, spans
from schedtrace.tracer.contract.framing import MARKER_SIZE, MARKER_TAG, Gap, Marker, read_marker
from schedtrace.tracer.contract.names import RELEASE_AFTER_CHECK_BYTES, SEEK_BYTES, UNKNOWN_TAGS
from schedtrace.tracer.contract.opening import read_framing, read_header
from schedtrace.tracer.contract.pass_chain import PassChain
from schedtrace.tracer.contract.schema import SCHEMA_VERSION, TAIL_SIZE, TAIL_TAG, Footer, Pass, PassDelta, Record
from schedtrace.tracer.contract.verify import Integrity, check_framed, check_plain, walk_plain

OTHER_TAGS: Final = "(other tags)"
NOT_TAGGED: Final = "expected a tagged record array"
_gap_start = attrgetter("start")


class TraceReader:
    """Random and streaming access to one trace file (see the module doc)."""

    def __init__(self, path: str | os.PathLike, *, max_record_bytes: int = MAX_RECORD_BYTES,
                 skip_damaged: bool = False) -> None:
        self.path = str(path)
        self.max_record_bytes = max_record_bytes
        self.skip_damaged = skip_damaged
        self.decoded_bytes = 0  # the size of the record decoded last (the pass chain's seek budget)
        self._mm = self._view = None
        try:
            self._file = open(self.path, "rb")
        except FileNotFoundError:
            raise TraceNotFoundError(self.path, "no such file") from None
        except IsADirectoryError:
            raise TraceNotFoundError(self.path, "is a directory, expected a trace file") from None
        except OSError as exc:
            raise TraceNotFoundError(self.path, f"cannot open: {exc.strerror}") from None
        self.file_size = os.fstat(self._file.fileno()).st_size
        if self.file_size == 0:
            self.close()
            raise TraceFormatError(self.path, 0, "empty file, expected a header record")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._mm)
        self.unknown_records: Counter[str] = Counter()
        self.footer: Footer | None = None
        self._found: Integrity | None = None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self.header, self._header_end = read_header(self._mm, self.path, self.file_size, self.max_record_bytes)
        self._seed, self._torn_at_header = read_framing(self._mm, self._view, self.path, self._header_end,
                                                        self.file_size)
        if self.header.schema_version > SCHEMA_VERSION:
            raise TraceVersionError(
                self.path, f"schema version {self.header.schema_version} is newer than this reader ({SCHEMA_VERSION})")
        deltas = self.header.schema_version >= 2
        if deltas and not self.framed:
            if self._header_end < self.file_size:
                raise TraceFormatError(self.path, self._header_end, "a v2 trace without batch markers (its deltas "
                                       "need the checksums)")
            self._seed, self._torn_at_header = 0, True  # cut just after its header: no data yet
        self._decoders = DATA_DECODERS if deltas else V1_DATA_DECODERS
        self._data_start = self._header_end + (MARKER_SIZE if self.framed and not self._torn_at_header else 0)
        self._data_end = self.file_size
        self._footer_records: int | None = None
        self._footer_gap: Gap | None = None
        try:
            info = None if self._torn_at_header else read_footer(
                self._mm, self._view, self.path, self.file_size, self._data_start, seed=self._seed,
                max_record_bytes=self.max_record_bytes, deltas=deltas)
        except TraceFormatError as exc:
            if not self.skip_damaged:
                raise
            # Read on as a file that was not closed; the tail is the unreadable part.
            info = None
            self._footer_gap = Gap(start=self.file_size - TAIL_SIZE, end=self.file_size, lost=0,
                                   reason=f"footer not used: {str(exc).removeprefix(self.path + ': ')}")
        self._chain = PassChain(self, None, None)
        if info is not None:
            self.footer, self._footer_offset = info.footer, info.offset
            self._data_end, self._footer_records = info.data_end, info.records_before
            self._chain = PassChain(self, info.pass_offsets, info.keyframes)

    # --- lifecycle ---

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._file.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the file is ---

    @property
    def framed(self) -> bool:
        """Whether the file carries batch markers and checksums (v1 traces do not)."""
        return self._seed is not None

    def verify(self) -> list[Gap]:
        """Check the whole data region now (once); the unreadable regions, in file order."""
        return self.gaps

    @property
    def gaps(self) -> list[Gap]:
        """The unreadable regions, in file order (v2: with the passes each leaves unrebuildable)."""
        return self._chain.with_orphans(self._integrity().gaps)

    @property
    def closed_cleanly(self) -> bool:
        """A checked footer and tail, and no unreadable region anywhere."""
        return self.footer is not None and not self._integrity().gaps

    @property
    def truncated_at(self) -> int | None:
        """A torn tail (the writer stopped mid-write): readable data ends at this offset."""
        return self._integrity().truncated_at

    @truncated_at.setter
    def truncated_at(self, offset: int | None) -> None:
        self._integrity().truncated_at = offset

    @property
    def unchecked_from(self) -> int | None:
        """Framed, not closed: records from this offset on have no checksum (a torn or unframed last batch)."""
        return self._integrity().unchecked_from

    @property
    def data_end(self) -> int:
        """Offset just past the last data record (footer, marker and tail excluded)."""
        return self._integrity().data_end

    def fingerprint(self) -> str:
        """Names this exact file (fingerprint.py)."""
        return file_fingerprint(self._mm, self._header_end, self.file_size)

    # --- records ---

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]:
        """Every known record in file order with its offset, header first (footer and markers excluded)."""
        if start <= 0:
            yield 0, self._decode(0, self._mm[: self._header_end])
        if self.skip_damaged:
            self._chain.offsets  # noqa: B018 - indexed first: a pass the index leaves out is a gap, not returned
        yield from self._chain.resolve(self._raw_records(start))

    def _raw_records(self, start: int) -> Iterator[tuple[int, Record]]:
        """The data records from ``start`` on as they are stored (v2: deltas not rebuilt)."""
        if not self.framed and self._found is None:
            yield from self._walk_plain(start)  # a v1 file not yet checked is checked by this very walk
            return
        for offset, end, count in self._readable_frames(start):  # a framed file is hashed first
            record = self._decode(offset, self._mm[offset:end]) if count == 1 and self._mm[offset] in ARRAYS else \
                self._refuse(offset, NOT_TAGGED, end, count)  # a run of 1-byte objects, or no array
            if record is not None:
                yield offset, record

    def record_at(self, offset: int) -> Record | None:
        """The record starting at ``offset`` (None for an unknown tag); a delta pass is rebuilt."""
        record = self._raw_record_at(offset)
        if type(record) is PassDelta:
            return self._chain.pass_at(self._chain.number_of(offset))
        return record

    def _raw_record_at(self, offset: int) -> Record | None:
        found = self._integrity()
        if offset == 0:
            return self._decode(0, self._mm[: self._header_end])
        gap = self._gap_holding(offset)
        if gap is not None:
            raise TraceDamagedError(self.path, gap)
        if not self._data_start <= offset < found.data_end:
            raise TraceFormatError(self.path, min(max(offset, 0), self.file_size - 1),
                                   f"no record at offset {offset}: outside the data")
        try:
            end = frame_end(self._mm, offset, found.data_end, self.max_record_bytes)
        except BadBytes as bad:
            raise self._bad_record(bad.offset, bad.reason) from None
        record = self._decode(offset, self._mm[offset:end])
        if record is None and self.skip_damaged:
            gap = self._gap_holding(offset)  # it failed just now
            if gap is not None:
                raise TraceDamagedError(self.path, gap)
        return record

    # --- passes ---

    @property
    def pass_offsets(self) -> array:
        """Byte offset of pass ``n`` at index ``n`` (a lost pass: the start of the gap that holds it)."""
        return self._chain.offsets

    @property
    def pass_count(self) -> int:
        return len(self._chain.offsets)

    def pass_at(self, n: int) -> Pass:
        """The pass with seq ``header.first_pass + n``; ``TraceDamagedError`` if it was lost."""
        return self._chain.pass_at(n)

    def passes(self, start: int = 0, stop: int | None = None) -> Iterator[Pass]:
        """Passes ``start``..``stop`` by number; with ``skip_damaged`` the lost ones are left out."""
        offsets = self.pass_offsets
        stop = len(offsets) if stop is None else min(stop, len(offsets))
        for n in range(max(start, 0), stop):
            try:
                yield self.pass_at(n)
            except TraceDamagedError:
                if not self.skip_damaged:
                    raise

    def release_pages(self, upto: int) -> None:
        """Drop the mapped pages before ``upto`` from our resident memory.

        A full scan touches every page of the map; the kernel keeps them
        charged to this process until told they are not needed.
        """
        length = min(upto, self.file_size) // mmap.PAGESIZE * mmap.PAGESIZE
        if length > 0 and self._mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED, 0, length)

    # --- checking ---

    def _integrity(self) -> Integrity:
        if self._found is None:
            closed = self.footer is not None
            if self._torn_at_header:
                found = Integrity(data_end=self._header_end, truncated_at=self._header_end)
            elif self.framed:
                found = check_framed(self._mm, self._view, self._data_start, self._data_end, closed=closed,
                                     seed=self._seed, total=self._footer_records,
                                     max_record_bytes=self.max_record_bytes)
            else:
                found = check_plain(self._mm, self._data_start, self._data_end, closed=closed,
                                    max_record_bytes=self.max_record_bytes,
                                    resync=self._chain.footer_offsets if closed else None)
            self._found = self._finish(found)
        return self._found

    def _finish(self, found: Integrity) -> Integrity:
        """A completed check: add the footer that could not be used, drop the pages it touched."""
        if self._footer_gap is not None and not (found.gaps and found.gaps[-1].end > self._footer_gap.start):
            found.gaps.append(self._footer_gap)
        if self.file_size >= RELEASE_AFTER_CHECK_BYTES:
            self.release_pages(self.file_size)
        return found

    def _walk_plain(self, start: int) -> Iterator[tuple[int, Record]]:
        """v1: the records from ``start`` on, damage handled as found; from the start, it is the check."""
        closed = self.footer is not None
        found = Integrity(data_end=self._data_end)
        resync = self._chain.footer_offsets if closed else None
        for item in walk_plain(self._mm, max(start, self._data_start), self._data_end, found, closed=closed,
                               max_record_bytes=self.max_record_bytes, resync=resync):
            if type(item) is Gap:
                if not self.skip_damaged:
                    raise TraceDamagedError(self.path, item)
                continue
            offset, data, tag = item
            record = self._decode(offset, data, tag)
            if record is not None:
                yield offset, record
        if start <= self._data_start and self._found is None:
            self._found = self._finish(found)

    def _readable_frames(self, start: int) -> Iterator[tuple[int, int, int]]:
        """(start, end, count) in the readable spans from ``start`` on: a record, or a run of 1-byte objects."""
        for region_start, region_end in self._regions(start):
            position = region_start
            while position < region_end:
                try:
                    yield from spans(self._mm, position, region_end, self.max_record_bytes)
                    position = region_end
                except BadBytes as bad:
                    position = self._frame_failed(bad, region_end)

    def _frame_failed(self, bad: BadBytes, region_end: int) -> int:
        """Where to go on after a record that will not step over in checked data (a torn end, or a gap)."""
        found = self._integrity()
        if bad.torn and region_end == found.data_end and found.truncated_at is not None:
            return region_end
        if not self.skip_damaged:
            raise TraceFormatError(self.path, bad.offset, bad.reason)
        gap = self._gap_holding(bad.offset)
        if gap is None:
            end, lost = self._rest_of_batch(bad.offset, region_end)
            gap = self._add_gap(Gap(start=bad.offset, end=end, lost=lost, reason=bad.reason, first_bad=bad.offset))
        return max(gap.end, bad.offset + 1)

    def _rest_of_batch(self, offset: int, limit: int) -> tuple[int, int | None]:
        """The end of the checked batch holding ``offset``, and how many of its records start there or later."""
        batches = self._integrity().batches
        at = bisect_right(batches, offset) - 1
        marker = read_marker(self._mm, batches[at], limit) if at >= 0 else None
        if not isinstance(marker, Marker) or marker.end <= offset:
            return limit, None  # not in a checked batch (an unchecked tail): its count is unknown
        try:
            before = sum(1 for _ in frames(self._mm, marker.payload, offset, self.max_record_bytes))
        except BadBytes:
            return min(marker.end, limit), None
        return min(marker.end, limit), max(marker.n_records - before, 0)

    def _bad_record(self, offset: int, reason: str, end: int | None = None, count: int = 1) -> TraceFormatError:
        """The error for ``count`` records that cannot be used (ending at ``end``); past damage, a gap is made."""
        if not self.skip_damaged:
            return TraceFormatError(self.path, offset, reason)
        return TraceDamagedError(self.path, self._bad_gap(offset, reason, end, count))

    def _refuse(self, offset: int, reason: str, end: int | None = None, count: int = 1) -> None:
        """``count`` records that cannot be used: raise, or (``skip_damaged``) make them a gap and go on."""
        if not self.skip_damaged:
            raise TraceFormatError(self.path, offset, reason)
        self._bad_gap(offset, reason, end, count)

    def _bad_gap(self, offset: int, reason: str, end: int | None, count: int = 1) -> Gap:
        """The gap holding the bad records at ``offset``, made one if there is none."""
        gaps = self._integrity().gaps
        gap = gaps[-1] if gaps and gaps[-1].start <= offset else self._gap_holding(offset)  # mostly: in file order
        if gap is not None and gap.start <= offset < max(gap.end, gap.start + 1):
            return gap
        try:
            end = end or frame_end(self._mm, offset, self._integrity().data_end, self.max_record_bytes)
        except BadBytes:
            end = offset + 1
        return self._add_gap(Gap(start=offset, end=end, lost=count, reason=reason, first_bad=offset))

    def _add_gap(self, gap: Gap) -> Gap:
        """Add a gap found while reading; one that starts where the last before it ends joins it (a run of bad
        records is one gap, so their gaps cost no more memory than their bytes)."""
        gaps = self._integrity().gaps
        at = len(gaps) if not gaps or gaps[-1].start <= gap.start else bisect_right(gaps, gap.start, key=_gap_start)
        before = gaps[at - 1] if at else None
        if before is not None and before.end == gap.start and before.lost is not None and gap.lost is not None:
            gap = gaps[at - 1] = msgspec.structs.replace(before, end=gap.end, lost=before.lost + gap.lost)
        else:
            gaps.insert(at, gap)
        self._chain.forget_lost()
        return gap

    def _gap_holding(self, offset: int) -> Gap | None:
        gaps = self._integrity().gaps
        at = bisect_right(gaps, offset, key=_gap_start) - 1
        if at >= 0 and gaps[at].start <= offset < max(gaps[at].end, gaps[at].start + 1):
            return gaps[at]
        return None

    def _regions(self, start: int) -> Iterator[tuple[int, int]]:
        """The readable spans from ``start`` on; at a gap, raise (default) or step over it."""
        found = self._integrity()
        limit = found.data_end
        position = max(start, self._data_start)
        for gap in list(found.gaps):  # a copy: a bad record read meanwhile adds its own gap
            if gap.start > limit:
                break  # past the data (an unused footer)
            if gap.end < position or (gap.end == position and gap.start < position):
                continue
            if gap.start > position:
                yield position, gap.start
            if not self.skip_damaged:
                raise TraceDamagedError(self.path, gap)
            position = max(position, gap.end)
        if position < limit:
            yield position, limit

    def _decode(self, offset: int, data: bytes, tag: str | None = None) -> Record | None:
        """The record in ``data`` (read at ``offset``); None for a marker, the tail or an unknown tag."""
        if tag is None:
            tag = peek_tag(data)
        end = offset + len(data)
        decoder = self._decoders.get(tag)
        if decoder is None:
            if tag is None:
                return self._refuse(offset, NOT_TAGGED, end)
            if tag in (MARKER_TAG, TAIL_TAG):
                return None  # framing, not a record (a bad marker is a gap already)
            if (tag == "header") != (offset == 0) or tag == "footer":
                return self._refuse(offset, f"a {tag} record inside the data", end)
            if tag == DELTA_TAG:
                return self._refuse(offset, "a delta pass record in a v1 trace", end)
            decoder = DECODERS.get(tag)
            if decoder is None:
                unknown = self.unknown_records
                unknown[tag if tag in unknown or len(unknown) < UNKNOWN_TAGS else OTHER_TAGS] += 1
                return None
        elif tag in PASS_TAGS and len(data) > SEEK_BYTES:
            return self._refuse(offset, f"a {tag} record of {len(data):,} bytes, more than a pass may hold "
                                f"({SEEK_BYTES:,})", end)
        self.decoded_bytes = len(data)
        try:
            return decoder.decode(data)
        except msgspec.DecodeError as exc:
            return self._refuse(offset, f"bad {tag!r} record: {exc}", end)

