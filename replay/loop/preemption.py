"""Priority preemption in replay: the counts a released running request leaves.

sglang's ``preempt_to_schedule`` releases running requests (``ScheduleBatch.release_req``)
and reads the pools again before it admits. Open loop, the recording answers each release
(``Pass.released``). A closed loop steps states no server ran, so each release frees what
the loop's own state says that request holds (``Releases.frees``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.schema import Released


@dataclass
class Releases:
    """One pass's releases: answered from the recording, else from ``frees``; ``done`` in order."""

    recorded: dict[str, Released]
    frees: dict[str, int] | None = None  # KV tokens each running request frees (closed loop)
    done: list[str] = field(default_factory=list)

    def counts(self, rid: str, available: int, evictable: int) -> tuple[int, int]:
        """Free and evictable tokens right after ``rid``'s release, from ``available``/``evictable`` before it."""
        released = self.recorded.pop(rid, None)
        if released is not None:
            self.done.append(rid)
            return released.available, released.evictable
        if self.frees is None or rid not in self.frees:
            raise ReplayStateError(f"preemption releases running request {rid!r}, which the recording did not")
        self.done.append(rid)
        return available + self.frees[rid], evictable


def requeued_at(pass_end_ns: int, order: int) -> int:
    """When a pass's ``order``-th released request re-enters the queue: at the pass's end, one after
    another (``_add_request_to_queue`` reads the clock for each), so the next preemption, which
    takes the newest of the lowest priority first, tells them apart."""
    return pass_end_ns + order


NO_RELEASES: Final = Releases({})  # a scheduler without priority preemption never releases (counts is never called)
