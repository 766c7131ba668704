"""Append records to one trace file, in checksummed batches, and say what reached the disk.

Durability policy:

* every ``write_many`` is one positioned write of whole batches (a large
  call is cut into several batches of about ``SPLIT_BYTES``, still one
  write), so a ``kill -9`` of the process loses nothing already written;
* ``fsync`` every ``fsync_every_s`` seconds (default 1 s; checked after each
  write, so an idle writer syncs at its next write or at close; None: never
  periodically), and on close: once after the footer, once after the tail;
* a power loss can therefore cost the records of the last ``fsync_every_s``
  seconds (more if nothing was written since, until close). The tail goes
  to disk only after the footer is durable, so a file that was closed reads
  as closed; whatever else the disk kept, the checksums tell good batches
  from damaged ones.

Failure contract (disk full, I/O error): when the OS takes only part of a
write, or refuses it, ``write_many`` cuts the file back to the end of the
last whole batch that reached it and raises ``TraceWriteError`` (an
``OSError``). ``records_written`` of the call's records are in the file,
``records_lost`` are not; ``counts``, ``size`` and the pass index cover
exactly what is in the file, so a later ``close`` writes a footer that
counts only that. The writer stays usable: the next call writes after the
last whole batch. If even the cut fails, the next call retries it first.
"""

from __future__ import annotations

import os
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from schedtrace.tracer.contract.codec import encode_into, offsets_to_bytes
from schedtrace.tracer.contract.errors import TraceWriteError
from schedtrace.tracer.contract.framing import MARKER_SIZE, SPLIT_BYTES, header_seed, marker_bytes
from schedtrace.tracer.contract.schema import TAIL_PREFIX, Footer, Header, Pass, Record

DEFAULT_FSYNC_EVERY_S: Final = 1.0
_NO_SPLIT: Final = 1 << 62
_RESERVED: Final = bytes(MARKER_SIZE)  # room for a batch's marker, filled once the batch is encoded


class FileOps:
    """The system calls the writer makes. A test passes a subclass that fails like a full disk."""

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


class _Cut:
    """One sealed batch inside the buffer: what the file gains if the bytes up to ``end`` land."""

    __slots__ = ("end", "records", "passes", "tags")

    def __init__(self, end: int, records: int, passes: int, tags: dict[str, int]) -> None:
        self.end, self.records, self.passes, self.tags = end, records, passes, tags


class TraceWriter:
    """Appends records to one trace file. Not thread-safe: the recorder calls it from one thread.

    ``framed=False`` writes the v1 layout (no batch markers, no checksums),
    for comparison and for tools that must produce v1 files.
    """

    def __init__(self, path: str | os.PathLike, header: Header, *, framed: bool = True,
                 fsync_every_s: float | None = DEFAULT_FSYNC_EVERY_S, ops: FileOps | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.framed = framed
        self.fsync_every_s = fsync_every_s
        self.sync_errors = 0  # fsyncs that failed (the data may not be durable; the writer goes on)
        self.counts: Counter[str] = Counter()
        self._ops = ops or FileOps()
        self._clock = clock
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0
        self._records = 0
        self._cut_pending = False
        self._pass_offsets = array("Q")
        self._buffer = bytearray()
        self._synced_at = clock()
        self._seed = 0
        try:
            self._write_header(header)
        except OSError:
            self.abandon()
            raise

    @property
    def size(self) -> int:
        """Bytes in the file: every whole batch written so far."""
        return self._size

    @property
    def passes(self) -> int:
        """Pass records in the file: after a lost batch, the next pass's seq is ``first_pass`` + this."""
        return len(self._pass_offsets)

    def _write_header(self, header: Header) -> None:
        buffer = self._buffer
        encode_into(header, buffer)
        cut = _Cut(len(buffer), 1, 0, {"header": 1})
        if self.framed:
            self._seed = header_seed(buffer)
            marker = marker_bytes(0, 1, b"", self._seed)
            self._seed = int.from_bytes(marker[-8:], "big")  # the first marker's checksum seeds the rest
            buffer += marker
            cut.end = len(buffer)
        self._put(buffer, [cut], array("Q"))

    def write(self, record: Record) -> None:
        self.write_many((record,))

    def write_many(self, records: Iterable[Record]) -> None:
        """Write ``records`` as whole batches in one write; raises ``TraceWriteError`` (see module doc)."""
        buffer = self._buffer
        buffer.clear()
        base = self._size
        split = SPLIT_BYTES if self.framed else _NO_SPLIT
        pass_offsets = array("Q")
        cuts: list[_Cut] = []
        start = 0
        tags: dict[str, int] = {}
        count = 0
        if self.framed:
            buffer += _RESERVED
        for record in records:
            if type(record) is Pass:
                pass_offsets.append(base + len(buffer))
            encode_into(record, buffer)
            tag = record.__struct_config__.tag
            tags[tag] = tags.get(tag, 0) + 1
            count += 1
            if len(buffer) - start >= split:
                cuts.append(self._seal(buffer, start, count, len(pass_offsets), tags, cuts))
                start, tags, count = len(buffer), {}, 0
                buffer += _RESERVED
        if count:
            cuts.append(self._seal(buffer, start, count, len(pass_offsets), tags, cuts))
        else:
            del buffer[start:]
        if cuts:
            self._put(buffer, cuts, pass_offsets)

    def _seal(self, buffer: bytearray, start: int, count: int, passes: int, tags: dict[str, int],
              cuts: list[_Cut]) -> _Cut:
        """Fill in the reserved marker of the batch that starts at ``start`` (framed only)."""
        if self.framed:
            before = self._records + sum(cut.records for cut in cuts)
            with memoryview(buffer) as view, view[start + MARKER_SIZE :] as payload:
                marker = marker_bytes(before, count, payload, self._seed)
            buffer[start : start + MARKER_SIZE] = marker
        return _Cut(len(buffer), count, passes, tags)

    def _put(self, buffer: bytearray, cuts: list[_Cut], pass_offsets: array) -> None:
        """Write ``buffer`` at the end of the file; keep the whole batches that land."""
        if self._cut_pending:
            try:
                self._cut_back()
            except OSError as exc:
                raise TraceWriteError(str(self.path), self._size, exc, 0, sum(cut.records for cut in cuts)) from None
        written, failure = self._write_at(buffer, self._size)
        kept = [cut for cut in cuts if cut.end <= written]
        for cut in kept:
            self.counts.update(cut.tags)
            self._records += cut.records
        if kept:
            self._pass_offsets.extend(pass_offsets[: kept[-1].passes])
            self._size += kept[-1].end
        if failure is not None:
            lost = sum(cut.records for cut in cuts) - sum(cut.records for cut in kept)
            offset = self._size
            self._cut_pending = written > (kept[-1].end if kept else 0)
            if self._cut_pending:
                try:
                    self._cut_back()
                except OSError:
                    pass  # retried before the next write; until then the reader sees a torn tail
            raise TraceWriteError(str(self.path), offset, failure, sum(cut.records for cut in kept), lost)
        if self.fsync_every_s is not None and self._clock() - self._synced_at >= self.fsync_every_s:
            self._sync()

    def _write_at(self, buffer: bytearray, offset: int) -> tuple[int, OSError | None]:
        """(bytes that reached the file, the error that stopped the rest or None)."""
        written = 0
        with memoryview(buffer) as view:
            while written < len(buffer):
                try:
                    with view[written:] as rest:
                        n = self._ops.pwrite(self._fd, rest, offset + written)
                except OSError as exc:
                    return written, exc
                if n <= 0:
                    return written, OSError(28, "the OS wrote nothing (disk full?)")
                written += n
        return written, None

    def _cut_back(self) -> None:
        self._ops.truncate(self._fd, self._size)
        self._cut_pending = False

    def _sync(self) -> None:
        try:
            self._ops.fsync(self._fd)
        except OSError:
            self.sync_errors += 1
        self._synced_at = self._clock()

    def close(self, t_ns: int, extra_counts: dict[str, int] | None = None) -> None:
        """Write the footer, sync, write the tail, sync, close. Idempotent.

        Raises ``TraceWriteError`` if the footer or tail cannot be written; the
        file then reads as not closed (call ``abandon`` to release it).
        """
        if self._fd < 0:
            return
        counts = dict(self.counts)
        counts.update(extra_counts or {})
        footer_offset = self._size + (MARKER_SIZE if self.framed else 0)
        self.write(Footer(t_ns=t_ns, counts=counts, pass_offsets=offsets_to_bytes(self._pass_offsets)))
        self._sync()
        tail = bytearray(TAIL_PREFIX + footer_offset.to_bytes(8, "big"))
        self._put(tail, [_Cut(len(tail), 0, 0, {})], array("Q"))
        self._sync()
        self.abandon()

    def abandon(self) -> None:
        """Close without a footer (the file then reads as not closed)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_trace(path: str | os.PathLike, header: Header, records: Iterable[Record], *, end_t_ns: int = 0,
                framed: bool = True) -> Path:
    """Write a complete, cleanly closed trace (used for built reproductions)."""
    writer = TraceWriter(path, header, framed=framed)
    writer.write_many(records)
    writer.close(end_t_ns)
    return writer.path
