"""Number the passes of a file that has no footer index, checking their seqs.

Index entry ``n`` is the pass whose ``seq`` is ``first_pass + n``. The
recorder numbers passes consecutively over the passes it writes, so a jump
is only allowed across a gap, by at most as many records as the gap lost;
the passes lost there get the gap's start as their entry (``pass_at`` then
names the gap). Anything else is an error naming the pass.
"""

from __future__ import annotations

from array import array
from typing import Final

from schedtrace.tracer.contract.errors import TraceFormatError
from schedtrace.tracer.contract.framing import Gap

# No pass record (whole or delta) is shorter: a gap of unknown count held at most size / this.
MIN_PASS_BYTES: Final = 24


def number_passes(path: str, first_pass: int, data_start: int, offsets: array, seqs: array,
                  gaps: list[Gap], whole: array | None = None) -> tuple[array, array]:
    """The index of the passes at ``offsets`` (file order) with ``seqs`` (-1: unreadable), and the
    numbers of those at the positions ``whole`` lists (v2: the keyframes, as pass numbers)."""
    index, keyframes = array("Q"), array("Q")
    marks = iter(whole or ())
    mark = next(marks, -1)
    expected, previous = first_pass, data_start
    for position, (offset, seq) in enumerate(zip(offsets, seqs)):
        if seq != expected:
            between = [gap for gap in gaps if previous <= gap.start < offset]
            room = sum((gap.end - gap.start) // MIN_PASS_BYTES if gap.lost is None else gap.lost for gap in between)
            if seq < expected or seq - expected > room:
                what = "the header's first_pass" if not index else "one after the pass before it"
                raise TraceFormatError(path, offset, f"pass record has seq {seq}, expected {expected} ({what})")
            index.extend(array("Q", [between[0].start]) * (seq - expected))
        if position == mark:
            keyframes.append(len(index))
            mark = next(marks, -1)
        index.append(offset)
        expected, previous = seq + 1, offset
    return index, keyframes
