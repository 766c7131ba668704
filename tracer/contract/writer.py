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

Format (docs/trace-format.md): v2 by default, where a pass between keyframes
is written as a delta against the pass written before it (keyframes.py says
when a pass goes whole); ``version=1`` writes every pass whole, as v1 readers
expect. v2 needs the batch checksums (a delta of a damaged pass would spread
the damage unseen), so an unframed file is always v1.

Failure contract (disk full, I/O error): when the OS takes only part of a
write, or refuses it, ``write_many`` cuts the file back to the end of the
last whole batch that reached it and raises ``TraceWriteError`` (an
``OSError``). ``records_written`` of the call's records are in the file,
``records_lost`` are not; ``counts``, ``size`` and the pass index cover
exactly what is in the file, so a later ``close`` writes a footer that
counts only that. The writer stays usable: the next call writes after the
last whole batch. If even the cut fails, the next call retries it first.
After a failure (or a ``Loss`` record) the next pass is a keyframe: the
passes a delta would refer to may not be in the file.

A pass larger whole than any pass may be (``SEEK_BYTES``, the seek budget of
keyframes.py) is not written, nor are its ``Alloc`` and ``Aiter`` events: a
``Loss`` (reason ``pass_too_large``) counting them takes their place, the
passes after it are numbered down to stay consecutive (their events too),
and ``left_out`` lists what the call left out.
"""

from __future__ import annotations

import os
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import msgspec

from schedtrace.tracer.contract.codec import encode_into, offsets_to_bytes
from schedtrace.tracer.contract.errors import TraceWriteError
from schedtrace.tracer.contract.framing import MARKER_SIZE, SPLIT_BYTES, header_seed, marker_bytes
from schedtrace.tracer.contract.keyframes import KeyframePolicy, PassEncoder, encode_whole_into
from schedtrace.tracer.contract.names import LOSS_PASS_TOO_LARGE
from schedtrace.tracer.contract.schema import (SCHEMA_VERSION, TAIL_PREFIX, Aiter, Alloc, Footer, Header, Loss, Pass,
                                               PassDelta, Record)

DEFAULT_FSYNC_EVERY_S: Final = 1.0
_NO_SPLIT: Final = 1 << 62
_RESERVED: Final = bytes(MARKER_SIZE)  # room for a batch's marker, filled once the batch is encoded
LOSS_TAG: Final = Loss.__struct_config__.tag


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

    __slots__ = ("end", "records", "passes", "keyframes", "tags", "taken")

    def __init__(self, end: int, records: int, passes: int, tags: dict[str, int], keyframes: int = 0,
                 taken: int | None = None) -> None:
        self.end, self.records, self.passes, self.tags = end, records, passes, tags
        self.keyframes = keyframes  # of the call's keyframes, how many are in this cut or before it
        self.taken = records if taken is None else taken  # the caller's records it holds, or left out


class TraceWriter:
    """Appends records to one trace file. Not thread-safe: the recorder calls it from one thread.

    ``version``: 2 (the default when framed) or 1 (every pass whole; the
    header's ``schema_version`` is set to it). ``framed=False`` writes the
    v1 layout (no batch markers, no checksums), for comparison and for tools
    that must produce v1 files. ``keyframes``: how often v2 writes a pass whole.
    """

    def __init__(self, path: str | os.PathLike, header: Header, *, framed: bool = True, version: int | None = None,
                 keyframes: KeyframePolicy | None = None,
                 fsync_every_s: float | None = DEFAULT_FSYNC_EVERY_S, ops: FileOps | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        version = (SCHEMA_VERSION if framed else 1) if version is None else version
        if version not in (1, SCHEMA_VERSION) or (version > 1 and not framed):
            raise ValueError(f"cannot write a version {version} trace{'' if framed else ' unframed'}")
        self.path = Path(path)
        self.framed = framed
        self.version = version
        self._passes = PassEncoder(keyframes) if version > 1 else None
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
        self._keyframes = array("Q")  # v2: numbers of the passes written whole
        self.first_pass = header.first_pass
        self.left_out: list[Record] = []  # the last write's records written as a Loss (LOSS_PASS_TOO_LARGE)
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

    @property
    def keyframes(self) -> array:
        """v2: the numbers of the passes in the file that were written whole (the footer's keyframe index)."""
        return self._keyframes

    def keyframe_next(self) -> None:
        """Write the next pass whole (v2): the caller knows passes before it are missing."""
        if self._passes is not None:
            self._passes.reset()

    def _write_header(self, header: Header) -> None:
        if header.schema_version != self.version:
            header = msgspec.structs.replace(header, schema_version=self.version)
        buffer = self._buffer
        encode_into(header, buffer)
        cut = _Cut(len(buffer), 1, 0, {"header": 1})
        if self.framed:
            self._seed = header_seed(buffer)
            marker = marker_bytes(0, 1, b"", self._seed)
            self._seed = int.from_bytes(marker[-8:], "big")  # the first marker's checksum seeds the rest
            buffer += marker
            cut.end = len(buffer)
        self._put(buffer, [cut], array("Q"), array("Q"))

    def write(self, record: Record) -> None:
        self.write_many((record,))

    def write_many(self, records: Iterable[Record]) -> None:
        """Write ``records`` as whole batches in one write; raises ``TraceWriteError`` (see module doc)."""
        pass_offsets = array("Q")
        keyframes = array("Q")  # indexes into this call's passes
        try:
            cuts = self._encode(records, pass_offsets, keyframes)
        except BaseException:
            self.keyframe_next()  # the passes a delta would be against never reached the file
            raise
        if cuts:
            self._put(self._buffer, cuts, pass_offsets, keyframes)

    def _encode(self, records: Iterable[Record], pass_offsets: array, keyframes: array) -> list[_Cut]:
        """Encode ``records`` into the buffer as sealed batches, noting where passes and keyframes go."""
        buffer = self._buffer
        buffer.clear()
        base = self._size
        split = SPLIT_BYTES if self.framed else _NO_SPLIT
        passes = self._passes
        cuts: list[_Cut] = []
        start = 0
        tags: dict[str, int] = {}
        count = 0
        if self.framed:
            buffer += _RESERVED
        left_out = self.left_out = []
        too_large: Loss | None = None  # in place of the pass left out last, and its events
        passes_left_out = 0  # the passes after them are numbered down by as many
        taken = 0  # the caller's records in the batch being encoded
        for record in records:
            kind = type(record)
            taken += 1
            if too_large is not None:
                if kind is Alloc or kind is Aiter:  # an event of the pass left out goes with it
                    too_large.count += 1
                    left_out.append(record)
                    continue
                count = self._loss_into(too_large, buffer, tags, count)
                too_large = None
            if left_out:
                _number_down(record, passes_left_out)
            if kind is Pass:
                at = base + len(buffer)
                written = self._pass_into(record, buffer)
                if written is None:
                    too_large = Loss(record.t_ns, 1, LOSS_PASS_TOO_LARGE)
                    left_out.append(record)
                    passes_left_out += 1
                    continue
                pass_offsets.append(at)
                if written:
                    keyframes.append(len(pass_offsets) - 1)
            else:
                if kind is Loss and passes is not None:
                    passes.reset()
                elif kind is PassDelta:
                    raise TypeError("write the full Pass: the writer makes the deltas")
                encode_into(record, buffer)
            tag = record.__struct_config__.tag
            tags[tag] = tags.get(tag, 0) + 1
            count += 1
            if len(buffer) - start >= split:
                cuts.append(self._seal(buffer, start, count, len(pass_offsets), tags, cuts, len(keyframes), taken))
                start, tags, count, taken = len(buffer), {}, 0, 0
                buffer += _RESERVED
        if too_large is not None:
            count = self._loss_into(too_large, buffer, tags, count)
        if count:
            cuts.append(self._seal(buffer, start, count, len(pass_offsets), tags, cuts, len(keyframes), taken))
        else:
            del buffer[start:]
        return cuts

    def _pass_into(self, p: Pass, buffer: bytearray) -> bool | None:
        """Encode ``p``: True if as a keyframe (v2), None if not at all (larger than any pass may be, SEEK_BYTES)."""
        if self._passes is not None:
            return self._passes.encode_into(p, buffer)
        return False if encode_whole_into(p, buffer) else None

    def _loss_into(self, loss: Loss, buffer: bytearray, tags: dict[str, int], count: int) -> int:
        """Encode the ``Loss`` written for a pass left out; the batch's record count with it."""
        encode_into(loss, buffer)
        tags[LOSS_TAG] = tags.get(LOSS_TAG, 0) + 1
        return count + 1

    def _seal(self, buffer: bytearray, start: int, count: int, passes: int, tags: dict[str, int],
              cuts: list[_Cut], keyframes: int, taken: int | None = None) -> _Cut:
        """Fill in the reserved marker of the batch that starts at ``start`` (framed only)."""
        if self.framed:
            before = self._records + sum(cut.records for cut in cuts)
            with memoryview(buffer) as view, view[start + MARKER_SIZE :] as payload:
                marker = marker_bytes(before, count, payload, self._seed)
            buffer[start : start + MARKER_SIZE] = marker
        return _Cut(len(buffer), count, passes, tags, keyframes, taken)

    def _put(self, buffer: bytearray, cuts: list[_Cut], pass_offsets: array, keyframes: array) -> None:
        """Write ``buffer`` at the end of the file; keep the whole batches that land."""
        if self._cut_pending:
            try:
                self._cut_back()
            except OSError as exc:
                self.keyframe_next()
                raise TraceWriteError(str(self.path), self._size, exc, 0, sum(cut.taken for cut in cuts)) from None
        written, failure = self._write_at(buffer, self._size)
        kept = [cut for cut in cuts if cut.end <= written]
        for cut in kept:
            self.counts.update(cut.tags)
            self._records += cut.records
        if kept:
            first = len(self._pass_offsets)
            self._keyframes.extend(first + k for k in keyframes[: kept[-1].keyframes])
            self._pass_offsets.extend(pass_offsets[: kept[-1].passes])
            self._size += kept[-1].end
        if failure is not None:
            self.keyframe_next()
            lost = sum(cut.taken for cut in cuts) - sum(cut.taken for cut in kept)
            offset = self._size
            self._cut_pending = written > (kept[-1].end if kept else 0)
            if self._cut_pending:
                try:
                    self._cut_back()
                except OSError:
                    pass  # retried before the next write; until then the reader sees a torn tail
            raise TraceWriteError(str(self.path), offset, failure, sum(cut.taken for cut in kept), lost)
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
        self.write(Footer(t_ns=t_ns, counts=counts, pass_offsets=offsets_to_bytes(self._pass_offsets),
                          keyframes=offsets_to_bytes(self._keyframes)))
        self._sync()
        tail = bytearray(TAIL_PREFIX + footer_offset.to_bytes(8, "big"))
        self._put(tail, [_Cut(len(tail), 0, 0, {})], array("Q"), array("Q"))
        self._sync()
        self.abandon()

    def abandon(self) -> None:
        """Close without a footer (the file then reads as not closed)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_trace(path: str | os.PathLike, header: Header, records: Iterable[Record], *, end_t_ns: int = 0,
                framed: bool = True, version: int | None = None) -> Path:
    """Write a complete, cleanly closed trace (used for built reproductions)."""
    writer = TraceWriter(path, header, framed=framed, version=version)
    writer.write_many(records)
    writer.close(end_t_ns)
    return writer.path


def _number_down(record: Record, passes: int) -> None:
    """Pass numbers stay consecutive over the passes in the file: after ``passes`` left out, the later ones
    (and the events that name them) move down by as many."""
    kind = type(record)
    if kind is Pass:
        record.seq -= passes
    elif kind is Alloc or kind is Aiter:
        record.pass_seq -= passes
