"""The order dfs-weight's tree created its branches, for a closed loop's passes.

sglang's dfs-weight walk breaks a tie between sibling subtrees of equal
weight by the order the server's radix tree created them. Open-loop replay
takes that from the recorded order (``Pass.order``); a closed loop decides
on queues the recording never saw, so each arm ranks a waiting request's
match by when its blocks entered the tree (``TreeAges``): those in it at the
loop's start first, by the recorded admission that first carried them, then
by arrival (``BlockAges``), then each as the arm's own prefills and chunks
inserted it. A branch enters the tree with the first family member to
prefill, not the first to arrive.
Pure: no sglang, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Final

from schedtrace.tracer.contract.order import order_runs
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES, split_ids
from schedtrace.tracer.contract.schema import Arrival, Header, WaitingReq

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopState

DFS_WEIGHT: Final = "dfs-weight"  # the policy whose order depends on the tree's branch order


def first_inserts(first_prefills: dict[str, tuple[int, bool, int]], overlap: bool) -> dict[str, tuple]:
    """rid -> a key ordering the recorded first prefills as they entered the server's tree
    (``TraceScan.first_prefills``: each one's pass, whether it began a chunked prefill, its place
    among the pass's admissions). A pass's new chunk is stashed into the tree at the next pass's
    start; its whole prefills are inserted when its results are processed: before that without
    the overlap scheduler, after it (during the next pass) with it. Within each, batch order."""
    return {rid: (at, chunked != overlap, place) for rid, (at, chunked, place) in first_prefills.items()}


class BlockAges:
    """Each prefix id's rank: the first request carrying it to enter the tree (``inserted``: rid ->
    a key ordering the recorded first prefills, ``first_inserts``), then to arrive; past
    ``LIMIT`` ids, later ones are unranked."""

    LIMIT: ClassVar[int] = 1 << 20  # ids kept: a hostile trace cannot grow it without bound

    def __init__(self, block: int, arrivals: Iterable[Arrival] = (), inserted: dict[str, tuple] | None = None) -> None:
        self.block = block
        self.first: dict[bytes, int] = {}
        self.ids: dict[str, bytes] = {}
        arrivals = list(arrivals)
        if inserted:  # the inserted first, in their order; then the rest, by arrival
            ranked = sorted(range(len(arrivals)), key=lambda i: (arrivals[i].rid not in inserted,
                                                                 inserted.get(arrivals[i].rid, ()), i))
            arrivals = [arrivals[i] for i in ranked]
        for arrival in arrivals:
            self.note(arrival)

    @classmethod
    def for_loop(cls, header: Header, arrivals: Iterable[Arrival],
                 inserted: dict[str, tuple] | None = None) -> BlockAges | None:
        """The ages a closed loop of ``header``'s server breaks ties by; None unless it ran dfs-weight."""
        if header.server_args.schedule_policy != DFS_WEIGHT:
            return None
        return cls(header.prefix_block, arrivals, inserted)

    def note(self, arrival: Arrival) -> None:
        if self.block <= 0 or not arrival.prefix_ids:
            return
        self.ids[arrival.rid] = arrival.prefix_ids
        first = self.first
        for block_id in split_ids(arrival.prefix_ids):
            if len(first) >= self.LIMIT:
                break
            first.setdefault(block_id, len(first))

    def for_arm(self, start: LoopState) -> TreeAges:
        return TreeAges(self, start)

    def matched(self, rid: str, tokens: int) -> list[bytes]:
        """The ids of the blocks holding ``rid``'s first ``tokens`` (the partial last one too)."""
        return split_ids(self.ids.get(rid, b"")[: -(-max(tokens, 0) // self.block) * PREFIX_ID_BYTES])


class TreeAges:
    """One arm's order of its tree's blocks: those in the tree at the loop's start (what its
    requests had prefilled or matched), by first arrival, then each as the arm's inserts landed it."""

    def __init__(self, base: BlockAges, start: LoopState) -> None:
        self.base = base
        self.made: dict[bytes, tuple[int, int]] = {}
        self._landed: dict[str, int] = {}  # rid -> tokens of it already aged
        for req in start.requests():
            self._age(req.rid, max(req.tree_len, req.prefix_len), at_start=True)

    def _age(self, rid: str, tokens: int, at_start: bool = False) -> None:
        made, first = self.made, self.base.first
        for block_id in self.base.matched(rid, tokens):
            if block_id not in made and len(made) < BlockAges.LIMIT:
                made[block_id] = (0, first.get(block_id, BlockAges.LIMIT)) if at_start else (1, len(made))
        self._landed[rid] = max(tokens, self._landed.get(rid, 0))

    def landed(self, state: LoopState) -> None:
        """The step's inserts (``LoopReq.tree_len``) reached the tree."""
        for req in state.held():
            if req.tree_len > self._landed.get(req.rid, 0):
                self._age(req.rid, req.tree_len)

    def queue_order(self, waiting: list[WaitingReq]) -> list[int] | None:
        """``Pass.order`` runs putting ``waiting`` in the order the tree made their matches'
        blocks (stable; a block it never made last); None when the trace has no ids."""
        base = self.base
        if base.block <= 0 or not base.ids:
            return None
        unmade = (2, 0)
        chains = [tuple(self.made.get(b, unmade) for b in base.matched(w.rid, w.prefix_len)) for w in waiting]
        return order_runs(sorted(range(len(waiting)), key=chains.__getitem__))
