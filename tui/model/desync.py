"""Where the ranks of a run disagree, by each rank's pass numbers (from ``analysis.ranks``).

The comparison (the one ``schedtrace ranks`` prints) reports every differing
point to ``add``; each point marks the pass every compared rank had there.
Under DP attention and DP only the ranks of one group are compared, so the
DP ranks' own scheduling is never a desync; ``dp_at`` gives their queues
side by side instead.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from typing import Final

from schedtrace.tracer.contract.report import DpCell, RankDiff, RanksReport

MAX_DETAILS: Final = 5_000  # differing points kept whole per rank (every one is marked)


class DesyncIndex:
    """Per rank label: the sorted pass numbers where it disagreed, and what differed there."""

    def __init__(self, first_pass: Mapping[str, int]) -> None:
        self._first = dict(first_pass)  # each rank's header.first_pass: pass numbers are seq minus it
        self._found: dict[str, list[int]] = {label: [] for label in first_pass}
        self._details: dict[str, dict[int, RankDiff]] = {label: {} for label in first_pass}
        self.passes: dict[str, array] = {}
        self.report: RanksReport | None = None
        self._start_wall: dict[str, int] = {}

    def add(self, diff: RankDiff) -> None:
        """One differing point (``compare_ranks``'s ``on_point``; called on its thread)."""
        for label, seq in diff.passes.items():
            if seq is None or label not in self._first:
                continue
            n = seq - self._first[label]
            self._found[label].append(n)
            details = self._details[label]
            if len(details) < MAX_DETAILS:
                details.setdefault(n, diff)

    def finish(self, report: RanksReport, start_wall: Mapping[str, int]) -> DesyncIndex:
        self.passes = {label: array("q", sorted(set(found))) for label, found in self._found.items()}
        self._found = {}
        self.report = report
        self._start_wall = dict(start_wall)
        return self

    def of(self, label: str) -> array:
        return self.passes.get(label, array("q"))

    def at(self, label: str, n: int) -> RankDiff | None:
        """What differed at pass ``n`` of rank ``label`` (None: agreed, or past the details kept)."""
        return self._details.get(label, {}).get(n)

    def summary(self, label: str) -> str:
        """One line for the header: the verdict, and how many of this rank's passes disagree."""
        report = self.report
        if report is None:
            return "comparing…"
        if report.verdict == "agree":
            return f"agree ({report.mode})"
        count = len(self.of(label))
        headers = f", {len(report.header_diffs)} header fields" if report.header_diffs else ""
        lockstep = report.dp.lockstep if report.dp is not None else None
        broken = ", clocks out of lockstep" if lockstep is not None and lockstep.broken else ""
        return f"DESYNC {count:,} pass{'' if count == 1 else 'es'}{headers}{broken}"

    def dp_at(self, label: str, t_ns: int) -> list[DpCell]:
        """The DP ranks' queue and batch in the timeline row holding time ``t_ns`` of rank ``label``."""
        report = self.report
        dp = report.dp if report is not None else None
        if dp is None or not dp.rows or label not in self._start_wall:
            return []
        start = min(self._start_wall.get(r, self._start_wall[label]) for r in dp.ranks)
        row = (self._start_wall[label] + t_ns - start) // dp.bucket_ns
        return dp.rows[max(0, min(row, len(dp.rows) - 1))].cells
