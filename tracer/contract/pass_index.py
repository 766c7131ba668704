"""Number the passes of a file that has no footer index, checking their seqs.

Index entry ``n`` is the pass whose ``seq`` is ``first_pass + n``. The
recorder numbers passes consecutively over the passes it writes, so a jump
is only allowed across a gap, by at most as many passes as the gap could
hold (its lost count, and never more than its bytes hold); the passes lost
there get the gap's start as their entry (``pass_at`` then names the gap).
Any other seq is a bad pass record: ``bad(offset, reason)`` raises (strict
reading) or returns, and then the record is left out of the index (the
reader has made it a gap of its own).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable

from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.names import MIN_PASS_BYTES



def room(gaps: list[Gap], start: int, stop: int) -> tuple[Gap | None, int]:
    """The first gap starting in ``start``..``stop`` and how many passes the gaps there could hold."""
    first = bisect_left(gaps, start, key=_start)
    at, held = first, 0
    while at < len(gaps) and gaps[at].start < stop:
        gap = gaps[at]
        fits = (gap.end - gap.start) // MIN_PASS_BYTES
        held += fits if gap.lost is None else min(gap.lost, fits)
        at += 1
    return (gaps[first] if at > first else None), held


def _start(gap: Gap) -> int:
    return gap.start


def number_passes(first_pass: int, data_start: int, offsets: array, seqs: array, gaps: list[Gap],
                  bad: Callable[[int, str], None], whole: array | None = None) -> tuple[array, array]:
    """The index of the passes at ``offsets`` (file order) with ``seqs`` (-1: unreadable), and the
    numbers of those at the positions ``whole`` lists (v2: the keyframes, as pass numbers)."""
    index, keyframes = array("Q"), array("Q")
    marks = iter(whole or ())
    mark = next(marks, -1)
    expected, previous = first_pass, data_start
    for position, (offset, seq) in enumerate(zip(offsets, seqs)):
        is_mark = position == mark
        if is_mark:
            mark = next(marks, -1)
        if seq != expected:
            gap, fits = room(gaps, previous, offset)
            if seq < expected or seq - expected > fits or gap is None:
                what = "the header's first_pass" if not index else "one after the pass before it"
                bad(offset, f"pass record has seq {seq}, expected {expected} ({what})")
                continue
            index.extend(array("Q", [gap.start]) * (seq - expected))
        if is_mark:
            keyframes.append(len(index))
        index.append(offset)
        expected, previous = seq + 1, offset
    return index, keyframes
