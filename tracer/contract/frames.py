"""Step over the msgpack objects of a mapped trace without decoding them.

``frames`` yields where each object starts and ends between two offsets,
with a bounded buffer: an object may not exceed the record limit, and a
declared size is never allocated before its bytes are there. What cannot be
stepped over raises ``BadBytes``, which the reader turns into a gap or an
error naming the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import msgpack


class BadBytes(Exception):
    """Internal: the object at ``offset`` cannot be read; ``torn``: the bytes end inside it."""

    def __init__(self, offset: int, reason: str, *, torn: bool = False) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason
        self.torn = torn


class _Window:
    """A file-like view of ``data[pos:limit]`` for ``msgpack.Unpacker``: it never reads past ``limit``."""

    __slots__ = ("_data", "_pos", "_limit")

    def __init__(self, data: mmap.mmap | bytes, start: int, limit: int) -> None:
        self._data, self._pos, self._limit = data, start, limit

    def read(self, n: int) -> bytes:
        start = self._pos
        self._pos = end = min(start + n, self._limit)
        return self._data[start:end]


def not_msgpack(exc: Exception) -> str:
    detail = str(exc).strip()
    return f"not a msgpack record ({detail})" if detail else f"not a msgpack record ({type(exc).__name__})"


def _unpacker(data: mmap.mmap | bytes, start: int, limit: int, max_record_bytes: int) -> msgpack.Unpacker:
    return msgpack.Unpacker(_Window(data, start, limit), max_buffer_size=max_record_bytes,
                            read_size=min(1 << 20, max_record_bytes))


def _bad(position: int, exc: Exception, max_record_bytes: int) -> BadBytes:
    """What the unpacker's ``exc`` at ``position`` means."""
    if isinstance(exc, msgpack.OutOfData):
        return BadBytes(position, "truncated record", torn=True)
    if isinstance(exc, msgpack.BufferFull):
        return BadBytes(position, f"record larger than the {max_record_bytes}-byte limit")
    return BadBytes(position, not_msgpack(exc))


_UNPACK_ERRORS = (msgpack.OutOfData, msgpack.BufferFull, ValueError, msgpack.FormatError, msgpack.StackError)


def frames(data: mmap.mmap | bytes, start: int, limit: int, max_record_bytes: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each object in ``data[start:limit]``, in order."""
    unpacker = _unpacker(data, start, limit, max_record_bytes)
    position = start
    while position < limit:
        try:
            unpacker.skip()
        except _UNPACK_ERRORS as exc:
            raise _bad(position, exc, max_record_bytes) from None
        end = start + unpacker.tell()
        yield position, end
        position = end


def spans(data: mmap.mmap | bytes, start: int, limit: int, max_record_bytes: int
          ) -> Iterator[tuple[int, int, int]]:
    """``frames`` with each run of 1-byte objects as one (start, end, count): none of them is a record
    (a record is a tagged array, 2 bytes at least), and a run costs one tuple, not one a byte."""
    unpacker = _unpacker(data, start, limit, max_record_bytes)
    position = run = start  # run: where the 1-byte objects before ``position`` began
    while position < limit:
        try:
            unpacker.skip()
        except _UNPACK_ERRORS as exc:
            if position > run:
                yield run, position, position - run  # the run before the bad bytes first
            raise _bad(position, exc, max_record_bytes) from None
        end = start + unpacker.tell()
        if end - position > 1:
            if position > run:
                yield run, position, position - run
            yield position, end, 1
            run = end
        position = end
    if position > run:
        yield run, position, position - run


def frame_end(data: mmap.mmap | bytes, offset: int, limit: int, max_record_bytes: int) -> int:
    """End of the one object at ``offset``, reading only what it needs."""
    unpacker = msgpack.Unpacker(max_buffer_size=max_record_bytes)
    fed, chunk = offset, 1 << 14
    while True:
        upto = min(fed + chunk, limit, offset + max_record_bytes)
        try:
            unpacker.feed(data[fed:upto])
            unpacker.skip()
        except msgpack.OutOfData:
            if upto >= limit:
                raise BadBytes(offset, "truncated record", torn=True) from None
            if upto >= offset + max_record_bytes:
                raise BadBytes(offset, f"record larger than the {max_record_bytes}-byte limit") from None
            fed, chunk = upto, chunk * 4
            continue
        except msgpack.BufferFull:
            raise BadBytes(offset, f"record larger than the {max_record_bytes}-byte limit") from None
        except (ValueError, msgpack.FormatError, msgpack.StackError) as exc:
            raise BadBytes(offset, not_msgpack(exc)) from None
        return offset + unpacker.tell()
