"""Find and check the footer of a cleanly closed trace, and its pass index.

The tail (the last ``TAIL_SIZE`` bytes) points at the footer record; in a
framed trace the footer has its own batch marker. Nothing in them is taken
on trust: the footer must end exactly where the tail begins (so a file
appended to, or concatenated with itself, is caught), its checksum must
match (framed), and its pass index must be whole entries, strictly
increasing, inside the data, and as long as the footer's pass count; a v2
footer's keyframe index must pass ``keyframes.keyframe_problem``; the
records its marker counts must fit in the data's bytes, and its counts be
non-negative and, for record tags, no more than that.
Anything else is a ``TraceFormatError`` naming the tail or footer offset.
"""

from __future__ import annotations

import mmap
import operator
from array import array
from dataclasses import dataclass
from itertools import islice

import msgspec

from schedtrace.tracer.contract.codec import DECODERS, offsets_from_bytes, peek_tag
from schedtrace.tracer.contract.errors import TraceFormatError
from schedtrace.tracer.contract.frames import BadBytes, frame_end
from schedtrace.tracer.contract.framing import MARKER_SIZE, MIN_RECORD_BYTES, Marker, marker_checks, read_marker
from schedtrace.tracer.contract.keyframes import keyframe_problem
from schedtrace.tracer.contract.schema import RECORD_TYPES, TAIL_PREFIX, TAIL_SIZE, Footer


@dataclass
class FooterInfo:
    footer: Footer
    offset: int  # of the footer record
    data_end: int  # just past the last data record (the footer's marker in a framed file)
    pass_offsets: array
    records_before: int | None  # framed: records before the footer, from its marker
    keyframes: array | None  # v2: the numbers of the passes written whole (None: v1, every pass is)


def read_footer(data: mmap.mmap, view: memoryview, path: str, size: int, data_start: int, *,
                seed: int | None, max_record_bytes: int, deltas: bool) -> FooterInfo | None:
    """The checked footer, or None when the file does not end in a tail (it was not closed)."""
    tail_at = size - TAIL_SIZE
    if tail_at < data_start or bytes(data[tail_at : tail_at + len(TAIL_PREFIX)]) != TAIL_PREFIX:
        return None
    offset = int.from_bytes(data[tail_at + len(TAIL_PREFIX) : size], "big")
    framed = seed is not None
    first = data_start + MARKER_SIZE if framed else data_start
    if not first <= offset < tail_at:
        raise TraceFormatError(path, tail_at, "tail points outside the file's data")
    try:
        end = frame_end(data, offset, tail_at, max_record_bytes)
    except BadBytes as bad:
        raise TraceFormatError(path, offset, f"tail does not point at a whole footer record ({bad.reason})") from None
    if end != tail_at:
        raise TraceFormatError(path, offset, f"the footer ends at offset {end} but the tail starts at {tail_at}: "
                               "bytes after the footer (a concatenated or appended file?)")
    records_before = None
    data_end = offset
    if framed:
        marker = read_marker(data, offset - MARKER_SIZE, offset)
        if not (isinstance(marker, Marker) and marker.n_records == 1 and marker.end == tail_at
                and marker_checks(view, marker, seed)):
            raise TraceFormatError(path, offset, "footer fails its checksum (or has no batch marker)")
        records_before, data_end = marker.records_before, marker.offset
        if records_before - 1 > (data_end - data_start) // MIN_RECORD_BYTES:
            raise TraceFormatError(path, offset, f"the footer's marker counts {records_before} records, more than "
                                   f"the {data_end - data_start} bytes of data hold")
    if peek_tag(data[offset : min(end, offset + 32)]) != "footer":
        raise TraceFormatError(path, offset, "tail does not point at a footer record")
    try:
        footer = DECODERS["footer"].decode(data[offset:end])
    except msgspec.DecodeError as exc:
        raise TraceFormatError(path, offset, f"bad 'footer' record: {exc}") from None
    _check_counts(path, offset, footer, records_before)
    offsets = _pass_index(path, offset, footer, data_start, data_end)
    keyframes = None
    if deltas:
        keyframes = _whole_entries(path, offset, footer.keyframes, "keyframe")
        problem = keyframe_problem(keyframes, len(offsets))
        if problem is not None:
            raise TraceFormatError(path, offset, f"footer keyframe index: {problem}")
    return FooterInfo(footer=footer, offset=offset, data_end=data_end, pass_offsets=offsets,
                      records_before=records_before, keyframes=keyframes)


def _check_counts(path: str, offset: int, footer: Footer, records_before: int | None) -> None:
    negative = [tag for tag, n in footer.counts.items() if n < 0]
    if negative:
        raise TraceFormatError(path, offset, f"footer count {negative[0]!r} is negative")
    records = sum(n for tag, n in footer.counts.items() if tag in RECORD_TYPES)
    if records_before is not None and records > records_before:
        raise TraceFormatError(path, offset, f"footer counts {records} records, its marker {records_before}")


def _whole_entries(path: str, offset: int, raw: bytes, what: str) -> array:
    if len(raw) % 8:
        raise TraceFormatError(path, offset, f"footer {what} index is {len(raw)} bytes, not whole 8-byte entries")
    return offsets_from_bytes(raw)


def _pass_index(path: str, offset: int, footer: Footer, data_start: int, data_end: int) -> array:
    offsets = _whole_entries(path, offset, footer.pass_offsets, "pass")
    counted = footer.counts.get("pass")
    if counted is not None and counted != len(offsets):
        raise TraceFormatError(path, offset, f"footer counts {counted} pass records but indexes {len(offsets)}")
    if offsets and not data_start <= offsets[0] < data_end:
        raise TraceFormatError(path, offset, "footer pass index entry 0 points outside the data")
    if not all(map(operator.lt, offsets, islice(offsets, 1, None))):
        entry = next(n for n in range(1, len(offsets)) if offsets[n] <= offsets[n - 1])
        raise TraceFormatError(path, offset, f"footer pass index entry {entry} is not after entry {entry - 1} "
                               "(entries out of order or repeated)")
    if offsets and offsets[-1] >= data_end:
        raise TraceFormatError(path, offset, f"footer pass index entry {len(offsets) - 1} points outside the data")
    return offsets
