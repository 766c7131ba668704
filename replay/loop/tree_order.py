"""The order dfs-weight's tree created its branches, for a closed loop's passes.

sglang's dfs-weight walk breaks a tie between sibling subtrees of equal
weight by the order the server's radix tree created them. Open-loop replay
takes that from the recorded order (``Pass.order``); a closed loop decides
on queues the recording never saw, so it ranks each waiting request by the
arrival that first carried each of its prefix blocks: the first family
member to arrive is the one whose prefill made the branch (``BlockAges``).
Pure: no sglang, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Final

from schedtrace.tracer.contract.order import order_runs
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES, split_ids
from schedtrace.tracer.contract.schema import Arrival, Header, WaitingReq

DFS_WEIGHT: Final = "dfs-weight"  # the policy whose order depends on the tree's branch order


class BlockAges:
    """Each prefix id's first arrival, in arrival order; past ``LIMIT`` ids, later ones are unranked."""

    LIMIT: ClassVar[int] = 1 << 20  # ids kept: a hostile trace cannot grow it without bound

    def __init__(self, block: int, arrivals: Iterable[Arrival] = ()) -> None:
        self.block = block
        self.first: dict[bytes, int] = {}
        self.ids: dict[str, bytes] = {}
        for arrival in arrivals:
            self.note(arrival)

    @classmethod
    def for_loop(cls, header: Header, arrivals: Iterable[Arrival]) -> BlockAges | None:
        """The ages a closed loop of ``header``'s server breaks ties by; None unless it ran dfs-weight."""
        return cls(header.prefix_block, arrivals) if header.server_args.schedule_policy == DFS_WEIGHT else None

    def note(self, arrival: Arrival) -> None:
        if self.block <= 0 or not arrival.prefix_ids:
            return
        self.ids[arrival.rid] = arrival.prefix_ids
        first = self.first
        for block_id in split_ids(arrival.prefix_ids):
            if len(first) >= self.LIMIT:
                break
            first.setdefault(block_id, len(first))

    def chain(self, w: WaitingReq) -> tuple[int, ...]:
        """The ages of the blocks of ``w``'s match (the partial last one too)."""
        data = self.ids.get(w.rid, b"")[: -(-max(w.prefix_len, 0) // self.block) * PREFIX_ID_BYTES]
        unranked = self.LIMIT
        return tuple(self.first.get(block_id, unranked) for block_id in split_ids(data))

    def queue_order(self, waiting: list[WaitingReq]) -> list[int] | None:
        """``Pass.order`` runs putting ``waiting`` in the order their branches were made (stable);
        None when the trace has no ids."""
        if self.block <= 0 or not self.ids:
            return None
        chains = [self.chain(w) for w in waiting]
        return order_runs(sorted(range(len(waiting)), key=chains.__getitem__))
