"""The start of a trace file: its header record, and whether batch markers follow it (framing.py).

A framed trace's first marker checks the header and seeds every later
checksum; without one the file is v1 (no checksums), unless markers that
lead from one to the next follow soon after the header (then the first was
damaged, and the file is refused: the header is what replay rebuilds the
server from).
"""

from __future__ import annotations

import mmap
from typing import NamedTuple

import msgspec

from schedtrace.tracer.contract.codec import DECODERS, peek_tag
from schedtrace.tracer.contract.errors import TraceFormatError
from schedtrace.tracer.contract.frames import BadBytes, frames
from schedtrace.tracer.contract.framing import (
    FIRST_BATCH_WINDOW,
    MARKER_PREFIX,
    TORN,
    Marker,
    header_seed,
    marker_checks,
    read_marker,
)
from schedtrace.tracer.contract.schema import Header
from schedtrace.tracer.contract.verify import PEEK_BYTES


class Framing(NamedTuple):
    seed: int | None  # the checksum seed of a framed file; None: v1, no markers
    torn_at_header: bool  # the file ends inside the header's marker: no data yet


def read_header(data: mmap.mmap, path: str, size: int, max_record_bytes: int) -> tuple[Header, int]:
    """The header and the offset just past it."""
    try:
        _, end = next(frames(data, 0, size, max_record_bytes))
    except BadBytes as bad:
        raise TraceFormatError(path, 0, "truncated header record" if bad.torn else bad.reason) from None
    raw = data[:end]
    if peek_tag(raw[:PEEK_BYTES]) != "header":
        raise TraceFormatError(path, 0, "expected a header record first; not a schedtrace file?")
    try:
        return DECODERS["header"].decode(raw), end
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, 0, f"bad 'header' record: {exc}") from None


def read_framing(data: mmap.mmap, view: memoryview, path: str, header_end: int, size: int) -> Framing:
    """Whether the file is framed, checking the header against the first marker."""
    marker = read_marker(data, header_end, size)
    if marker == TORN:
        return Framing(0, True)
    if isinstance(marker, Marker):
        with view[:header_end] as header_bytes:
            seed = header_seed(header_bytes)
        if (marker.records_before, marker.n_records, marker.n_bytes) == (0, 1, 0) and \
                marker_checks(view, marker, seed):
            return Framing(marker.checksum, False)
        raise TraceFormatError(path, 0, "header fails its checksum (the batch marker after it does not match)")
    if _batches_follow(data, header_end, size):
        raise TraceFormatError(path, header_end, "batch markers follow the header, but not the one that checks it")
    return Framing(None, False)


def _batches_follow(data: mmap.mmap, header_end: int, size: int) -> bool:
    """Whether a marker soon after the header leads to another (the file is framed, its first marker gone)."""
    window_end = min(size, header_end + FIRST_BATCH_WINDOW)
    at = data.find(MARKER_PREFIX, header_end, window_end)
    for _ in range(16):  # a few candidates: a lone marker-like run of bytes proves nothing
        if at < 0:
            return False
        marker = read_marker(data, at, size)
        if isinstance(marker, Marker) and 0 < marker.n_records <= marker.n_bytes:
            following = read_marker(data, marker.end, size)
            if isinstance(following, Marker) or marker.end == size:
                return True
        at = data.find(MARKER_PREFIX, at + 1, window_end)
    return False
