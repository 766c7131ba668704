"""Read and write trace files: a plain msgpack stream of schema records.

Layout: ``Header``, then passes and events in time order, then (on clean
close only) ``Footer`` and a fixed-size tail ``["tail", <footer offset>]``.
A file without the tail was not closed cleanly; the reader then indexes it
with one linear scan and reports where its valid prefix ends.

Untrusted input: a record may not exceed ``MAX_RECORD_BYTES`` and every
failure names the file and the byte offset.
"""

from __future__ import annotations

import mmap
import os
import sys
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Final

import msgpack
import msgspec

from schedtrace.tracer.contract.errors import TraceFormatError, TraceNotFoundError, TraceVersionError
from schedtrace.tracer.contract.schema import (
    RECORD_TYPES,
    SCHEMA_VERSION,
    TAIL_PREFIX,
    TAIL_SIZE,
    TAIL_TAG,
    Footer,
    Header,
    Pass,
    Record,
)

MAX_RECORD_BYTES: Final = 64 * 1024 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoders = {tag: msgspec.msgpack.Decoder(cls) for tag, cls in RECORD_TYPES.items()}


def encode(record: Record) -> bytes:
    return _encoder.encode(record)


def encode_into(record: Record, buffer: bytearray) -> None:
    """Append one record to ``buffer`` (no copy of what is already there)."""
    _encoder.encode_into(record, buffer, -1)


def _offsets_to_bytes(offsets: array) -> bytes:
    if sys.byteorder != "little":
        offsets = array("Q", offsets)
        offsets.byteswap()
    return offsets.tobytes()


def _offsets_from_bytes(raw: bytes) -> array:
    offsets = array("Q")
    offsets.frombytes(raw)
    if sys.byteorder != "little":
        offsets.byteswap()
    return offsets


class TraceWriter:
    """Appends records to one trace file with unbuffered writes.

    Each ``write_many`` hands its bytes to the OS in one ``os.write``, so a
    ``kill -9`` loses nothing already written. Not thread-safe: the recorder
    calls it from its single writer thread.
    """

    def __init__(self, path: str | os.PathLike, header: Header) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0
        self._pass_offsets = array("Q")
        self.counts: Counter[str] = Counter()
        self._buffer = bytearray()
        self.write_many([header])

    @property
    def size(self) -> int:
        return self._size

    def write(self, record: Record) -> None:
        self.write_many((record,))

    def write_many(self, records: Iterable[Record]) -> None:
        buffer = self._buffer
        buffer.clear()
        for record in records:
            if type(record) is Pass:
                self._pass_offsets.append(self._size + len(buffer))
            encode_into(record, buffer)
            self.counts[record.__struct_config__.tag] += 1
        view = memoryview(buffer)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(buffer)

    def close(self, t_ns: int, extra_counts: dict[str, int] | None = None) -> None:
        """Write the footer and tail, then close. Idempotent."""
        if self._fd < 0:
            return
        counts = dict(self.counts)
        counts.update(extra_counts or {})
        footer_offset = self._size
        self.write(Footer(t_ns=t_ns, counts=counts, pass_offsets=_offsets_to_bytes(self._pass_offsets)))
        tail = TAIL_PREFIX + footer_offset.to_bytes(8, "big")
        os.write(self._fd, tail)
        self._size += len(tail)
        os.close(self._fd)
        self._fd = -1

    def abandon(self) -> None:
        """Close without a footer (the file then reads as unclosed)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_trace(path: str | os.PathLike, header: Header, records: Iterable[Record], *, end_t_ns: int = 0) -> Path:
    """Write a complete, cleanly closed trace (used for built reproductions)."""
    writer = TraceWriter(path, header)
    writer.write_many(records)
    writer.close(end_t_ns)
    return writer.path


class TraceReader:
    """Random and streaming access to one trace file.

    ``header`` is read on open. The pass index comes from the footer when the
    file was closed cleanly, otherwise from one linear scan on first use;
    that scan also finds ``truncated_at``, the offset where a torn tail starts.
    """

    def __init__(self, path: str | os.PathLike, *, max_record_bytes: int = MAX_RECORD_BYTES) -> None:
        self.path = str(path)
        self.max_record_bytes = max_record_bytes
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
        self.unknown_records: Counter[str] = Counter()
        self.truncated_at: int | None = None
        self.footer: Footer | None = None
        self._footer_offset: int | None = None
        self._pass_offsets: array | None = None
        self.header = self._read_header()
        self._read_footer()

    # --- lifecycle ---

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            mm.close()
            self._mm = None
        self._file.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API ---

    @property
    def closed_cleanly(self) -> bool:
        return self.footer is not None

    @property
    def data_end(self) -> int:
        """Offset just past the last record that is not footer or tail."""
        return self._footer_offset if self._footer_offset is not None else self.file_size

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]:
        """Every known record in file order with its offset (footer excluded)."""
        for offset, end in self._frames(start):
            record = self._decode(offset, end)
            if record is not None:
                yield offset, record

    def passes(self, start: int = 0, stop: int | None = None) -> Iterator[Pass]:
        offsets = self.pass_offsets
        stop = len(offsets) if stop is None else min(stop, len(offsets))
        for n in range(max(start, 0), stop):
            yield self.pass_at(n)

    def record_at(self, offset: int) -> Record | None:
        """The record starting at ``offset`` (None for an unknown tag)."""
        return self._decode(offset, self._frame_end(offset))

    def release_pages(self, upto: int) -> None:
        """Drop the mapped pages before ``upto`` from our resident memory.

        A full scan touches every page of the map; the kernel keeps them
        charged to this process until told they are not needed.
        """
        length = min(upto, self.file_size) // mmap.PAGESIZE * mmap.PAGESIZE
        if length > 0 and self._mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED, 0, length)

    @property
    def pass_count(self) -> int:
        return len(self.pass_offsets)

    def pass_at(self, n: int) -> Pass:
        offsets = self.pass_offsets
        if not 0 <= n < len(offsets):
            raise IndexError(f"pass {n} out of range (trace has {len(offsets)})")
        offset = offsets[n]
        record = self.record_at(offset)
        if not isinstance(record, Pass):
            raise TraceFormatError(self.path, offset, f"index entry {n} does not point at a pass record")
        return record

    @property
    def pass_offsets(self) -> array:
        if self._pass_offsets is None:
            self._pass_offsets = self._scan_pass_offsets()
        return self._pass_offsets

    # --- framing ---

    def _frames(self, start: int = 0) -> Iterator[tuple[int, int]]:
        """(start, end) of each msgpack object up to the footer; notes a torn tail."""
        limit = self.data_end
        self._file.seek(start)
        unpacker = msgpack.Unpacker(
            self._file, max_buffer_size=self.max_record_bytes, read_size=min(1 << 20, self.max_record_bytes)
        )
        position = start
        while position < limit:
            if not self._skip_one(unpacker, position):
                self.truncated_at = position
                return
            end = start + unpacker.tell()
            if end > limit:
                raise TraceFormatError(self.path, position, "record runs into the footer")
            yield position, end
            position = end

    def _frame_end(self, offset: int) -> int:
        """End of the one record at ``offset``, reading only what it needs."""
        unpacker = msgpack.Unpacker(max_buffer_size=self.max_record_bytes)
        limit = self.data_end
        fed, chunk = offset, 1 << 14
        while True:
            upto = min(fed + chunk, limit)
            unpacker.feed(self._mm[fed:upto])
            fed, chunk = upto, chunk * 4
            if self._skip_one(unpacker, offset):
                return offset + unpacker.tell()
            if fed >= limit:
                raise TraceFormatError(self.path, offset, "truncated record")

    def _skip_one(self, unpacker: msgpack.Unpacker, offset: int) -> bool:
        """Step over one object; False if the bytes end inside it."""
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            return False
        except msgpack.BufferFull:
            raise TraceFormatError(
                self.path, offset, f"record larger than the {self.max_record_bytes}-byte limit"
            ) from None
        except (ValueError, msgpack.FormatError, msgpack.StackError) as exc:
            raise TraceFormatError(self.path, offset, f"not a msgpack record ({exc})") from None
        return True

    def _decode(self, offset: int, end: int) -> Record | None:
        data = self._mm[offset:end]
        tag = _peek_tag(data)
        if tag is None:
            raise TraceFormatError(self.path, offset, "expected a tagged record array")
        decoder = _decoders.get(tag)
        if decoder is None:
            if tag != TAIL_TAG:
                self.unknown_records[tag] += 1
            return None
        try:
            return decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(self.path, offset, f"bad {tag!r} record: {exc}") from None

    # --- header, footer, index ---

    def _read_header(self) -> Header:
        for offset, end in self._frames(0):
            data = self._mm[offset:end]
            if _peek_tag(data) != "header":
                raise TraceFormatError(self.path, 0, "expected a header record first; not a schedtrace file?")
            header = self._decode(offset, end)
            assert isinstance(header, Header)
            if header.schema_version > SCHEMA_VERSION:
                raise TraceVersionError(
                    self.path,
                    f"schema version {header.schema_version} is newer than this reader ({SCHEMA_VERSION})",
                )
            self._header_end = end
            return header
        raise TraceFormatError(self.path, 0, "truncated header record")

    def _read_footer(self) -> None:
        if self.file_size < TAIL_SIZE + self._header_end:
            return
        tail = self._mm[self.file_size - TAIL_SIZE :]
        if not tail.startswith(TAIL_PREFIX):
            return
        footer_offset = int.from_bytes(tail[len(TAIL_PREFIX) :], "big")
        if not self._header_end <= footer_offset < self.file_size - TAIL_SIZE:
            raise TraceFormatError(self.path, self.file_size - TAIL_SIZE, "tail points outside the file")
        self._footer_offset = self.file_size - TAIL_SIZE  # frame limit while reading it
        try:
            footer = self._decode(footer_offset, self._frame_end(footer_offset))
        finally:
            self._footer_offset = None
        if not isinstance(footer, Footer):
            raise TraceFormatError(self.path, footer_offset, "tail does not point at a footer record")
        offsets = _offsets_from_bytes(footer.pass_offsets)
        if len(footer.pass_offsets) % 8 or any(o >= footer_offset for o in offsets[-1:]):
            raise TraceFormatError(self.path, footer_offset, "footer pass index is malformed")
        self.footer = footer
        self._footer_offset = footer_offset
        self._pass_offsets = offsets

    def _scan_pass_offsets(self) -> array:
        offsets = array("Q")
        for offset, end in self._frames(self._header_end):
            tag = _peek_tag(self._mm[offset : min(end, offset + 16)])
            if tag == "pass":
                offsets.append(offset)
        return offsets


def _peek_tag(data: bytes) -> str | None:
    """The tag of an encoded record: the first element of its top array."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        pos = 1
    elif first == 0xDC:
        pos = 3
    elif first == 0xDD:
        pos = 5
    else:
        return None
    if pos >= len(data):
        return None
    marker = data[pos]
    if 0xA0 <= marker <= 0xBF:
        length, pos = marker & 0x1F, pos + 1
    elif marker == 0xD9 and pos + 1 < len(data):
        length, pos = data[pos + 1], pos + 2
    else:
        return None
    try:
        return bytes(data[pos : pos + length]).decode("utf-8")
    except UnicodeDecodeError:
        return None
