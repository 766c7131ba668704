"""Check a trace's data region once: which bytes are good, which are gaps, where it ends.

Framed traces (framing.py) are checked batch by batch against their
checksums, hopping from marker to marker without parsing records. A batch
that fails is skipped to the next marker that checks out; that marker's
``records_before`` says how many records the gap held. In a file that was
not closed, the bytes after the last good batch are either a torn batch (its
marker promises more bytes than the file holds) or bytes no marker covers;
both are read as a plain stream, unchecked, from ``unchecked_from``.

v1 traces have no checksums: every record is stepped over once. In a closed
v1 file a bad record is skipped to the next pass the footer indexes (the
records in between are lost, how many is unknown).

Nothing a marker claims is used before it is checked against the bytes: a
marker after a damaged region is a place to resume only if the records it
says the region held fit in the region's bytes (``MIN_RECORD_BYTES`` each),
and the checksums the search for one tries may hash at most
``HASH_BUDGET`` times the data (fake markers every few bytes would
otherwise make it quadratic); past that the rest is one gap.
"""

from __future__ import annotations

import mmap
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

import msgspec

from schedtrace.tracer.contract.codec import DECODERS, PASS_TAGS, peek_seq, peek_tag
from schedtrace.tracer.contract.framing import (
    MARKER_PREFIX,
    MARKER_SIZE,
    MARKER_TAG,
    MIN_RECORD_BYTES,
    SPLIT_BYTES,
    TORN,
    Gap,
    Marker,
    marker_checks,
    read_marker,
)
from schedtrace.tracer.contract.names import HASH_BUDGET, LOCATE_BYTES
from schedtrace.tracer.contract.frames import BadBytes, frames
from schedtrace.tracer.contract.schema import TAIL_PREFIX, TAIL_SIZE

PEEK_BYTES: Final = 32  # enough for any tag and a pass's seq


@dataclass
class Integrity:
    """What one check of the data region found."""

    data_end: int  # where the data ends (a footer inside an unclosed stream ends it early)
    gaps: list[Gap] = field(default_factory=list)
    truncated_at: int | None = None  # a torn tail: readable data ends here
    unchecked_from: int | None = None  # framed: records from here on have no checksum to pass
    # v1: (offset, seq) of every pass record met, so an unclosed file needs one walk (seq -1: unreadable).
    pass_offsets: array = field(default_factory=lambda: array("Q"))
    pass_seqs: array = field(default_factory=lambda: array("q"))
    batches: array = field(default_factory=lambda: array("Q"))  # framed: the offset of every good marker


def note_pass(offset: int, record: bytes, offsets: array, seqs: array) -> None:
    """Add a pass record's offset and seq (-1: not a plain seq) to an index being built."""
    seq = peek_seq(record)
    offsets.append(offset)
    seqs.append(-1 if seq is None or seq >= 1 << 63 else seq)


def _after_footer(data: mmap.mmap, footer_end: int, limit: int, found: Integrity) -> Gap | None:
    """A footer met inside an unclosed stream: what follows may only be a torn tail."""
    rest = bytes(data[footer_end : min(limit, footer_end + TAIL_SIZE + 1)])
    if len(rest) <= TAIL_SIZE and TAIL_PREFIX.startswith(rest[: len(TAIL_PREFIX)]):
        if len(rest) < TAIL_SIZE:
            found.truncated_at = footer_end
        return None  # a whole tail did not check out: the reader reports the footer it could not use
    gap = Gap(start=footer_end, end=limit, lost=None,
              reason="bytes after the footer that are not its tail (a concatenated file?)")
    found.gaps.append(gap)
    return gap


def walk_plain(data: mmap.mmap, start: int, limit: int, found: Integrity, *, closed: bool, max_record_bytes: int,
               resync: array | None = None, markers_are_damage: bool = False
               ) -> Iterator[tuple[int, bytes, str | None] | Gap]:
    """Step over every record in ``data[start:limit]``: a v1 trace, or the unchecked tail of a framed one.

    Yields each record's (start, bytes, tag), and each ``Gap`` as it is found
    (also added to ``found``, which is complete when the walk ends).
    Every pass record is noted in ``found`` (the index of a file without a usable footer).
    """
    position = start
    while position < limit:
        try:
            for offset, end in frames(data, position, limit, max_record_bytes):
                position = end
                record = data[offset:end]
                tag = peek_tag(record)
                if tag in PASS_TAGS:
                    note_pass(offset, record, found.pass_offsets, found.pass_seqs)
                elif tag == "footer" and not closed:
                    found.data_end = offset
                    gap = _after_footer(data, end, limit, found)
                    if gap is not None:
                        yield gap
                    return
                elif tag == "header" or (tag == MARKER_TAG and markers_are_damage):
                    what = "a header" if tag == "header" else "a batch marker that does not check out"
                    raise BadBytes(offset, f"{what} inside the data (a concatenated or damaged file?)")
                yield offset, record, tag
        except BadBytes as bad:
            # torn: the file ends inside the record, unless batches follow it (then it is damage, not a cut)
            if bad.torn and not closed and not (markers_are_damage and data.find(MARKER_PREFIX, bad.offset + 1,
                                                                                   limit) >= 0):
                found.truncated_at = bad.offset
                return
            reason = "record runs past the end of the data" if bad.torn else bad.reason
            upto = limit
            if resync is not None:
                later = bisect_right(resync, bad.offset)
                upto = resync[later] if later < len(resync) else limit
            gap = Gap(start=bad.offset, end=upto, lost=None, reason=reason)
            found.gaps.append(gap)
            yield gap
            position = upto


def check_plain(data: mmap.mmap, start: int, limit: int, *, closed: bool, max_record_bytes: int,
                resync: array | None = None, markers_are_damage: bool = False) -> Integrity:
    """The whole walk of ``walk_plain``, for what it found."""
    found = Integrity(data_end=limit)
    for _ in walk_plain(data, start, limit, found, closed=closed, max_record_bytes=max_record_bytes, resync=resync,
                        markers_are_damage=markers_are_damage):
        pass
    return found


def _sane(marker: Marker, max_batch: int) -> bool:
    return 0 < marker.n_records and marker.n_records * MIN_RECORD_BYTES <= marker.n_bytes <= max_batch


def fits(records: int, start: int, end: int) -> bool:
    """Whether ``records`` records (a count a marker claims) fit in the bytes ``start``..``end``."""
    return 0 <= records <= (end - start) // MIN_RECORD_BYTES


class _Budget:
    """Bytes the check may still hash for batches that fail (it stops resyncing once they are spent)."""

    __slots__ = ("left",)

    def __init__(self, data_bytes: int, max_batch: int) -> None:
        self.left = HASH_BUDGET * data_bytes + 2 * max_batch

    def checks(self, view: memoryview, marker: Marker, seed: int) -> bool:
        if marker_checks(view, marker, seed):
            return True
        self.left -= MARKER_SIZE + marker.n_bytes
        return False


def _next_good_marker(data: mmap.mmap, view: memoryview, gap_start: int, limit: int, expected: int,
                      max_batch: int, seed: int, budget: _Budget) -> Marker | None:
    """The first marker after ``gap_start`` that checks out, does not go back in the count, and claims
    no more records for the gap than its bytes hold; None past the hashing budget."""
    start = gap_start + 1
    while budget.left > 0:
        at = data.find(MARKER_PREFIX, start, limit)
        if at < 0:
            return None
        marker = read_marker(data, at, limit)
        if (isinstance(marker, Marker) and fits(marker.records_before - expected, gap_start, at)
                and _sane(marker, max_batch) and marker.end <= limit and budget.checks(view, marker, seed)):
            return marker
        start = at + 1
    return None


def locate(data: mmap.mmap, gap: Gap, max_record_bytes: int) -> Gap:
    """The gap with ``first_bad``: the first record in it that does not parse or decode, if any."""
    limit = min(gap.end, gap.start + LOCATE_BYTES)
    try:
        for offset, end in frames(data, gap.start, limit, max_record_bytes):
            tag = peek_tag(data[offset : min(end, offset + PEEK_BYTES)])
            if tag is None:
                return msgspec.structs.replace(gap, first_bad=offset)
            decoder = DECODERS.get(tag)
            if decoder is not None:
                try:
                    decoder.decode(data[offset:end])
                except msgspec.DecodeError:
                    return msgspec.structs.replace(gap, first_bad=offset)
    except BadBytes as bad:
        if bad.offset < gap.end and not (bad.torn and limit < gap.end):
            return msgspec.structs.replace(gap, first_bad=bad.offset)
    return gap


def check_framed(data: mmap.mmap, view: memoryview, start: int, limit: int, *, closed: bool, seed: int,
                 total: int | None, max_record_bytes: int) -> Integrity:
    """Check every batch from ``start`` (just past the header's marker) to ``limit``.

    ``total``: records before the footer, from its marker (closed files), so a
    gap at the end still says how many records it lost.
    """
    found = Integrity(data_end=limit)
    max_batch = max_record_bytes + SPLIT_BYTES
    budget = _Budget(limit - start, max_batch)
    position, expected = start, 1
    while position < limit:
        marker = read_marker(data, position, limit)
        if marker == TORN and not closed:
            found.truncated_at = position
            return found
        if isinstance(marker, Marker):
            in_order = marker.records_before == expected and _sane(marker, max_batch)
            if in_order and marker.end <= limit:
                if budget.checks(view, marker, seed):
                    if not closed and peek_tag(data[marker.payload : marker.payload + PEEK_BYTES]) == "footer":
                        found.data_end = position  # closed, but the tail is torn
                        _after_footer(data, marker.end, limit, found)
                        return found
                    found.batches.append(position)
                    position, expected = marker.end, expected + marker.n_records
                    continue
                reason = "batch fails its checksum"
            elif in_order and not closed:  # the last batch, torn: read what is there, unchecked
                return _unchecked_tail(data, marker.payload, limit, found, torn=True, max_record_bytes=max_record_bytes)
            elif marker.records_before != expected:
                reason = f"batch out of order (it follows {marker.records_before} records, expected {expected})"
            elif marker.end > limit:
                reason = "batch runs past the end of the data"
            else:
                reason = "batch marker with impossible sizes"
        else:
            reason = "no batch marker where the next batch should start"
        following = _next_good_marker(data, view, position, limit, expected, max_batch, seed, budget)
        if following is None:
            if marker is None and not closed:  # bytes no marker covers after the last batch
                return _unchecked_tail(data, position, limit, found, torn=False, max_record_bytes=max_record_bytes)
            lost = total - expected if total is not None and fits(total - expected, position, limit) else None
            found.gaps.append(locate(data, Gap(start=position, end=limit, lost=lost, reason=reason),
                                     max_record_bytes))
            return found
        found.gaps.append(locate(data, Gap(start=position, end=following.offset,
                                           lost=following.records_before - expected, reason=reason),
                                 max_record_bytes))
        position, expected = following.offset, following.records_before
    if total is not None and expected != total:  # no bytes are left for the difference: its count is unknown
        found.gaps.append(Gap(start=limit, end=limit, lost=None,
                              reason=f"the batches hold {expected} records, the footer's marker says {total}"))
    return found


def _unchecked_tail(data: mmap.mmap, start: int, limit: int, found: Integrity, *, torn: bool,
                    max_record_bytes: int) -> Integrity:
    tail = check_plain(data, start, limit, closed=False, max_record_bytes=max_record_bytes, markers_are_damage=True)
    found.unchecked_from = start
    found.gaps += tail.gaps
    found.data_end = tail.data_end
    found.truncated_at = tail.truncated_at
    if found.truncated_at is None and torn and not tail.gaps:
        found.truncated_at = tail.data_end  # the batch promised more bytes than the file holds
    return found
