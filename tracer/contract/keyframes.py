"""Format v2's keyframes: when the writer writes a pass whole, and what the reader holds it to.

A keyframe is a plain ``pass`` record; the passes between keyframes are
``delta`` records (delta.py). The writer writes a keyframe for the first
pass of every file, after anything it could not write or was told it lost
(a failed write, a ``Loss`` record), and then whenever the deltas since the
last keyframe hold ``bytes_ratio`` times that keyframe's bytes or
``walk_bytes`` bytes, whichever is less, or ``every`` passes have gone by.
The ratio rule keeps keyframes at most 1 / (1 + ``bytes_ratio``) of the pass
bytes whatever the queue length; the walk rule bounds what a reader decodes
and applies to reach any pass (a seek's cost follows the delta bytes it
walks: at a 1,000-request backlog a keyframe is some 50 KB, and the ratio
rule alone let 100 KB of deltas, 300 passes, pile up behind it); the count
rule bounds how many deltas it applies. Where keyframes fall is otherwise
the writer's choice: a reader takes any placement within the two rules
below, so files written under an older placement read as before.

Three rules bind every writer, and the reader refuses a file that breaks them:
every pass is fewer than ``MAX_KEYFRAME_INTERVAL`` passes after its
keyframe; the deltas after a keyframe make a reader build at most
``BUILT_ROWS_PER_BYTE`` rows per byte of the file from the keyframe to the
delta (``rebuild_cost``, ``cost_allowed``); and the pass records from a
keyframe through any delta after it hold at most ``SEEK_BYTES`` (so does
any one pass record, in v1 too). A delta of a few bytes can step every
running row, so without the second rule a reading costs the rows of the
passes, not the bytes of the file; without the third, one seek costs up to
a thousand records of the record limit. The writer writes a keyframe before
a delta would break either (a running batch of more than some 150 requests
decoding; a chain past SEEK_BYTES), and a pass too large to be written whole
is not written (the caller writes a ``Loss`` in its place).
"""

from __future__ import annotations

import operator
from array import array
from itertools import islice
from typing import Final

import msgspec

from schedtrace.tracer.contract.codec import encode_into
from schedtrace.tracer.contract.delta import Differ, rebuild_cost
from schedtrace.tracer.contract.names import (BUILT_ROWS_PER_BYTE, COPIES_PER_BUILT_ROW, MAX_KEYFRAME_INTERVAL,
                                              SEEK_BYTES)
from schedtrace.tracer.contract.schema import Pass

DEFAULT_BYTES_RATIO: Final = 2.0
DEFAULT_WALK_BYTES: Final = 24 << 10  # a seek walks at most this many delta bytes (about 0.5 ms at a 1,000 backlog)


class KeyframePolicy(msgspec.Struct, frozen=True):
    every: int = MAX_KEYFRAME_INTERVAL  # passes from one keyframe to the next, at most
    bytes_ratio: float = DEFAULT_BYTES_RATIO  # delta bytes since a keyframe, in units of its size, before the next
    walk_bytes: int = DEFAULT_WALK_BYTES  # delta bytes since a keyframe before the next, at most

    def __post_init__(self) -> None:
        if not 1 <= self.every <= MAX_KEYFRAME_INTERVAL:
            raise ValueError(f"keyframe interval {self.every} outside 1..{MAX_KEYFRAME_INTERVAL}")


class PassEncoder:
    """The writer's pass encoding in v2: a keyframe or a delta against the pass written before."""

    def __init__(self, policy: KeyframePolicy | None = None) -> None:
        self.policy = policy or KeyframePolicy()
        self._differ = Differ()
        self._deltas = 0  # written since the last keyframe
        self._delta_bytes = 0
        self._keyframe_bytes = 0
        self._cost = 0  # rebuild_cost of the deltas since the last keyframe

    def reset(self) -> None:
        """The next pass is a keyframe (what came before may not be in the file)."""
        self._differ.reset()

    def encode_into(self, p: Pass, buffer: bytearray) -> bool | None:
        """Append ``p`` to ``buffer``; True if it went as a keyframe, None if it went not at all: whole, it
        is larger than any pass may be (SEEK_BYTES; the caller writes a Loss, and the next pass is a keyframe)."""
        before = len(buffer)
        previous = self._differ.previous
        keyframe = (previous is None or p.seq != previous.seq + 1 or self._deltas + 1 >= self.policy.every
                    or self._delta_bytes >= min(self.policy.bytes_ratio * self._keyframe_bytes,
                                                self.policy.walk_bytes))
        delta = None if keyframe else self._differ.diff(p)
        cost = 0 if delta is None else self._cost + rebuild_cost(delta)
        if cost > cost_allowed(self._keyframe_bytes + self._delta_bytes):  # the reader's budget (below)
            delta = None
        if delta is not None:
            encode_into(delta, buffer)
            if self._keyframe_bytes + self._delta_bytes + len(buffer) - before > SEEK_BYTES:  # the seek budget
                del buffer[before:]
                delta = None
        if delta is None and not encode_whole_into(p, buffer):
            self.reset()
            return None
        size = len(buffer) - before
        if delta is None:
            self._deltas, self._delta_bytes, self._keyframe_bytes, self._cost = 0, 0, size, 0
        else:
            self._deltas += 1
            self._delta_bytes += size
            self._cost = cost
        self._differ.keep(p)
        return delta is None


def encode_whole_into(p: Pass, buffer: bytearray) -> bool:
    """Append ``p`` whole (a keyframe, or a v1 pass); False, appending nothing, if it is larger than any pass
    may be (SEEK_BYTES)."""
    before = len(buffer)
    encode_into(p, buffer)
    if len(buffer) - before > SEEK_BYTES:
        del buffer[before:]
        return False
    return True


def cost_allowed(span: int) -> int:
    """The ``rebuild_cost`` the deltas after a keyframe may add up to by a delta ``span`` bytes after it."""
    return BUILT_ROWS_PER_BYTE * COPIES_PER_BUILT_ROW * span


def keyframe_problem(keyframes: array, passes: int) -> str | None:
    """What is wrong with a keyframe index (pass numbers) of a file of ``passes`` passes, or None."""
    if not keyframes:
        return "no keyframe index" if passes else None
    if keyframes[0] != 0:
        return f"the first pass is not a keyframe (the first keyframe is pass {keyframes[0]})"
    if keyframes[-1] >= passes:
        return f"keyframe {keyframes[-1]} is past the last pass ({passes - 1})"
    steps = list(map(operator.sub, islice(keyframes, 1, None), keyframes))
    if steps and min(steps) <= 0:
        return "keyframes out of order or repeated"
    if max(steps, default=0) > MAX_KEYFRAME_INTERVAL or passes - keyframes[-1] > MAX_KEYFRAME_INTERVAL:
        return f"keyframes more than {MAX_KEYFRAME_INTERVAL} passes apart"
    return None
