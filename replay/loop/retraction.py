"""Which decoding requests a retraction keeps, and the batch order it leaves.

sglang's ``ScheduleBatch._get_decode_retraction_order`` ranks the batch from the
one it most prefers to keep: by output length, then the shorter prompt
(``--retraction-policy length``, the default), or first by priority
(``priority``). ``retract_decode`` pops from the end of that ranking and
keeps the batch in it (``filter_batch(keep_indices=sorted_indices)``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedtrace.tracer.contract.schema import Header

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopReq

RETRACTION_POLICY = "retraction_policy"  # the recorded server setting (Header.settings)
BY_PRIORITY = "priority"


@dataclass(frozen=True)
class RetractionOrder:
    by_priority: bool = False
    low_values_first: bool = False  # --schedule-low-priority-values-first

    @classmethod
    def of(cls, header: Header) -> RetractionOrder:
        return cls(by_priority=header.settings.get(RETRACTION_POLICY) == BY_PRIORITY,
                   low_values_first=header.low_priority_values_first)

    def key(self, req: LoopReq) -> tuple[int, ...]:
        # processed outputs: under overlap the last forward's are not yet in output_ids
        length = (req.output_len - req.inflight, -req.input_len)
        if not self.by_priority:
            return length
        sign = 1 if self.low_values_first else -1
        priority = req.priority
        if priority is None:
            priority = sys.maxsize if self.low_values_first else -sys.maxsize - 1
        return (priority * -sign, *length)

    def ranked(self, reqs: list[LoopReq]) -> list[LoopReq]:
        """``reqs`` from the one kept first (stable, as sglang's sort)."""
        return sorted(reqs, key=self.key, reverse=True)


BY_LENGTH = RetractionOrder()
