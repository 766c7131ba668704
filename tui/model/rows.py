"""The pass list's rows: the columns of one pass, and which passes the list shows."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

from schedtrace.tracer.analysis.outcome import pass_outcome
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tui.model.durations import humanize_ns


@dataclass(frozen=True)
class PassRow:
    """The columns of one pass-list line."""

    seq: int
    time: str
    waiting: int
    running: int
    kv: str
    admitted: str  # "requests (tokens)"
    chunk: str  # the continuing chunk's tokens
    result: str


PASS_HEADER: Final = PassRow(seq=-1, time="time", waiting=0, running=0, kv="free/evict", admitted="admit(tok)",
                             chunk="chunk", result="result")


def pass_row(p: Pass) -> PassRow:
    tokens = sum(a.extend_len for a in p.admitted)
    return PassRow(
        seq=p.seq,
        time=humanize_ns(p.t_ns),
        waiting=len(p.waiting),
        running=len(p.running),
        kv=f"{p.kv.available}/{p.kv.evictable}",
        admitted=f"{len(p.admitted)} ({tokens})" if p.admitted else "",
        chunk=str(p.chunk.size) if p.chunk is not None and p.chunk.size else "",
        result=pass_outcome(p),
    )


@dataclass(frozen=True)
class ListedPasses:
    """The passes the list shows: all ``count`` of them, or only a filter's ``matches`` (ascending)."""

    count: int
    matches: array | None = None

    def __len__(self) -> int:
        return len(self.matches) if self.matches is not None else self.count

    def pass_of(self, row: int) -> int:
        return self.matches[row] if self.matches is not None else row

    def row_of(self, pass_no: int) -> int:
        """The row showing ``pass_no``, or the nearest one after it."""
        if self.matches is None:
            return max(0, min(pass_no, self.count - 1))
        return min(bisect_left(self.matches, pass_no), max(len(self.matches) - 1, 0))

    def nearest(self, pass_no: int) -> int | None:
        """The listed pass a move to ``pass_no`` lands on (None: the list is empty)."""
        return self.pass_of(self.row_of(pass_no)) if len(self) else None
