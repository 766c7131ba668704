"""Pure stall detection over passes and the decisions an arm made on them.

A stall is a run of at least ``min_passes`` consecutive passes where requests
wait, the free + evictable KV would fit the head request's uncached tokens,
and nothing is admitted. Folded records count ``repeat`` passes; idle passes
between records (nothing waiting) end a run.
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.report import Decision, Stall
from tracer.schema import Pass

DEFAULT_MIN_PASSES = 8


def is_stalled(p: Pass, d: Decision) -> bool:
    """Requests wait, the head would fit in free + evictable KV, and nothing got in."""
    if not p.waiting or d.admitted:
        return False
    head = p.waiting[0]
    need = head.input_len + head.output_len - head.prefix_len
    return need <= p.kv.available + p.kv.evictable


class StallScanner:
    """Incremental ``find_stalls``: feed passes in order, then ``finish``."""

    def __init__(self, min_passes: int) -> None:
        if min_passes < 1:
            raise ValueError("min_passes must be at least 1")
        self.min_passes = min_passes
        self.stalls: list[Stall] = []
        self._start: int | None = None
        self._end = 0
        self._count = 0
        self._head: str | None = None

    def feed(self, seq: int, repeat: int, idle_before: int, stalled: bool, head_rid: str | None) -> None:
        if self._start is not None and (idle_before > 0 or not stalled):
            self._close()
        if not stalled:
            return
        if self._start is None:
            self._start, self._count, self._head = seq, 0, head_rid
        self._end = seq
        self._count += max(repeat, 1)

    def _close(self) -> None:
        if self._start is not None and self._count >= self.min_passes:
            self.stalls.append(
                Stall(start_pass=self._start, end_pass=self._end, passes=self._count, head_rid=self._head)
            )
        self._start = None

    def finish(self) -> list[Stall]:
        self._close()
        return self.stalls


def find_stalls(passes: Sequence[Pass], decisions: Sequence[Decision], min_passes: int) -> list[Stall]:
    """Stalls of one arm; ``decisions[i]`` is the arm's decision on ``passes[i]``."""
    if len(passes) != len(decisions):
        raise ValueError(f"{len(passes)} passes but {len(decisions)} decisions")
    scanner = StallScanner(min_passes)
    for p, d in zip(passes, decisions):
        scanner.feed(p.seq, p.repeat, p.idle_before, is_stalled(p, d), p.waiting[0].rid if p.waiting else None)
    return scanner.finish()
