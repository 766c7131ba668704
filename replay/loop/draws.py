"""The random policy's draws in a closed loop: the recording's, carried onto the loop's queue.

sglang's ``random`` policy shuffles the whole queue every pass
(``random.shuffle(waiting_queue)``), and the trace keeps each draw as
``Pass.order``. Where the loop's queue is the recorded one at that pass, the
loop takes the draw as it is. Where it is not (one request admitted a pass
early, or left a pass late), the draw still says how the server ordered the
requests both queues hold: they keep that order, and a request the recorded
queue lacked goes in at a place drawn by a generator seeded by the pass, so
a replay stays deterministic. Drawing afresh instead makes one slip a new
shuffle of every pass after it. A pass with no recorded draw (the recording
was idle there) draws its own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.order import OrderError, order_indexes, order_runs
from schedtrace.tracer.contract.schema import WaitingReq

RANDOM = "random"  # sglang's --schedule-policy that shuffles the queue every pass

Draw = tuple[tuple[str, ...], "list[int] | None"]  # (the recorded queue's rids in entry order, Pass.order)


@dataclass
class RecordedDraws:
    """Each recorded random pass's draw, by scheduler pass."""

    by_pass: dict[int, Draw] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_pass)

    def order_at(self, iteration: int, waiting: Sequence[WaitingReq]) -> list[int] | None:
        """``Pass.order`` for the loop's pass ``iteration`` over ``waiting``, in entry order."""
        rids = tuple(w.rid for w in waiting)
        recorded = self.by_pass.get(iteration)
        if recorded is not None and recorded[0] == rids:
            return recorded[1]
        rng = random.Random(iteration)
        if recorded is None:
            perm = list(range(len(rids)))
            rng.shuffle(perm)
            return order_runs(perm)
        try:
            return order_runs(carried_draw(recorded, rids, rng))
        except OrderError as exc:  # as the driver says of a damaged draw it replays
            raise ReplayStateError(f"random policy: the recorded order at pass {iteration} is damaged: {exc}") from None


def carried_draw(recorded: Draw, rids: Sequence[str], rng: random.Random) -> list[int]:
    """Entry indexes of ``rids`` in queue order: the rows the recorded queue also held in its
    drawn order, each other row inserted at a place ``rng`` draws."""
    recorded_rids, runs = recorded
    drawn = [recorded_rids[i] for i in order_indexes(runs, len(recorded_rids))]
    rank = {rid: k for k, rid in enumerate(drawn)}
    perm = sorted((i for i, rid in enumerate(rids) if rid in rank), key=lambda i: rank[rids[i]])
    for i, rid in enumerate(rids):
        if rid not in rank:
            perm.insert(rng.randrange(len(perm) + 1), i)
    return perm
