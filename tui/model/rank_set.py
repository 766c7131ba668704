"""The ranks the browser shows: one run's, each read as one continuous trace, and how to open one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Record
from schedtrace.tracer.contract.rank_keys import rank_label
from schedtrace.tracer.contract.traceset import RankTrace

Reader = TraceReader | RankTrace  # what the views read a rank through


def open_rank(rank: RankTrace) -> Reader:
    """A new reader of every part of ``rank`` (pass numbers continue across parts), read past
    its gaps (``skip_damaged``), so a damaged file still browses."""
    if len(rank.parts) == 1:
        return TraceReader(rank.parts[0].path, skip_damaged=True)
    parts = [replace(p, skip_damaged=True) for p in rank.parts]
    return RankTrace(label=rank.label, key=rank.key, parts=parts)  # part readers of its own


class StoppableRank(RankTrace):
    """``rank`` read by a worker that may be cancelled: its records end early once ``cancelled()``
    (quitting must not wait for a whole comparison; what was read is then thrown away)."""

    CHECK_EVERY: Final = 4_096  # records between looks at ``cancelled``

    def __init__(self, rank: RankTrace, cancelled: Callable[[], bool]) -> None:
        super().__init__(label=rank.label, key=rank.key, parts=list(rank.parts))
        self.cancelled = cancelled

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]:
        for i, item in enumerate(super().records(start)):
            if i % self.CHECK_EVERY == 0 and self.cancelled():
                return
            yield item


def reopen(reader: Reader) -> Reader:
    """Another reader of what ``reader`` reads, for a thread of its own."""
    if isinstance(reader, RankTrace):
        return open_rank(reader)
    return TraceReader(reader.path, skip_damaged=reader.skip_damaged)


def label_of(reader: Reader) -> str:
    return reader.label if isinstance(reader, RankTrace) else rank_label(reader.header)


@dataclass(frozen=True)
class RankSet:
    """The ranks of one run, in (pp, dp, tp) order; the browser shows one at a time."""

    run: str
    ranks: tuple[RankTrace, ...]

    def __len__(self) -> int:
        return len(self.ranks)

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.ranks]

    def position(self, i: int) -> str:
        """``tp1 2/4``: the rank shown and where it is among the run's."""
        return f"{self.ranks[i].label} {i + 1}/{len(self.ranks)}"
