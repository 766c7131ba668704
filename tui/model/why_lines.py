"""The one line per pass that says why nothing (more) was admitted, as ``analysis.why`` words it.

``why`` runs sglang's admission arithmetic on the counts the earlier
admissions of the same pass left; that costs about 0.1 ms a pass, so lines
are made only for the passes on screen and kept in a small cache.
"""

from __future__ import annotations

from collections import OrderedDict

from schedtrace.tracer.analysis.why import Why, why
from schedtrace.tracer.contract.report import Divergence
from schedtrace.tracer.contract.schema import Header, Pass
from schedtrace.tui.model.latch import LatchRuns


class WhyLines:
    """``why`` of pass number ``n`` under the recorded decision, cached; and under each arm's."""

    def __init__(self, header: Header, size: int = 1024) -> None:
        self.header = header
        self.size = size
        self.latch: LatchRuns | None = None  # from the scan; until then "latched" has no "since"
        self._cache: OrderedDict[int, Why] = OrderedDict()

    def set_latch(self, latch: LatchRuns | None) -> None:
        self.latch = latch
        self._cache.clear()

    def latched_since(self, n: int) -> int | None:
        return self.latch.since_at(n) if self.latch is not None else None

    def of(self, n: int, p: Pass) -> Why:
        """Why pass number ``n`` (record ``p``) admitted nothing more, as recorded."""
        hit = self._cache.get(n)
        if hit is not None:
            self._cache.move_to_end(n)
            return hit
        line = self._cache[n] = why(p, self.header, latched_since=self.latched_since(n))
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return line

    def by_arm(self, n: int, p: Pass, divergence: Divergence, arms: tuple[str, str]) -> list[tuple[str, Why]]:
        """Each arm's line on a divergent pass, under the decision that arm made."""
        since = self.latched_since(n)
        return [(arm, why(p, self.header, decision, latched_since=since))
                for arm, decision in zip(arms, (divergence.old, divergence.new))]
