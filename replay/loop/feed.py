"""What reaches a closed loop from outside, step by step (``ArrivalFeed``): the recorded
arrivals, each request's recorded prefix match from its pass on, and the recording's aborts
and rejections, each at the pass that took it (``LoopInput.leaves``)."""

from __future__ import annotations

from dataclasses import replace

from schedtrace.replay.loop.input import LoopInput
from schedtrace.replay.loop.state import LoopReq, LoopState


class ArrivalFeed:
    """What reaches a closed loop from outside, step by step: the recorded
    arrivals, and each request's recorded prefix match from its pass on."""

    def __init__(self, loop: LoopInput) -> None:
        self._arrivals = loop.arrivals
        self._matches = loop.matches
        self._leaves = loop.leaves
        self._next_leave = 0
        self.left: list[str] = []  # requests that left the queue unrun, for the caller to take
        self.chunk_aborted: str | None = None  # the chunked request a client aborted, for the caller to end
        self._next = self._next_match = 0
        self._revealed: dict[str, tuple[int, int | None]] = {}
        self.arrived: dict[str, int] = {r.rid: 0 for r in loop.initial.waiting}  # rid -> step it arrived

    def feed(self, state: LoopState, step: int) -> None:
        """Add to ``state`` what comes by ``step``."""
        while self._next_match < len(self._matches) and self._matches[self._next_match][0] <= step:
            _, rid, prefix, locked = self._matches[self._next_match]
            self._next_match += 1
            self._revealed[rid] = (prefix, locked)
            for req in state.waiting:
                if req.rid == rid:
                    _reveal(req, prefix, locked)
        while self._next < len(self._arrivals) and self._arrivals[self._next][0] <= step:
            req = replace(self._arrivals[self._next][1])
            self._next += 1
            _reveal(req, *self._revealed.get(req.rid, (0, None)))
            state.waiting.append(req)
            self.arrived[req.rid] = step
        while self._next_leave < len(self._leaves) and self._leaves[self._next_leave][0] <= step:
            rid = self._leaves[self._next_leave][1]
            self._next_leave += 1
            # Aborted or rejected in the recording: it leaves a loop's queue then too, and a
            # chunked prefill ends (a request this arm already runs, it keeps: its finish ends it).
            kept = [r for r in state.waiting if r.rid != rid]
            if len(kept) < len(state.waiting):
                state.waiting = kept
                self.left.append(rid)
            elif state.chunked is not None and state.chunked.rid == rid:
                self.chunk_aborted = rid

    def next_event(self, state: LoopState) -> int | None:
        """The next step something comes that can change ``state``'s decisions (None: nothing will)."""
        steps = [self._arrivals[self._next][0]] if self._next < len(self._arrivals) else []
        waiting = {r.rid for r in state.waiting if _revealable(r)}
        steps += [step for step, rid, _, _ in self._matches[self._next_match:] if rid in waiting][:1]
        return min(steps, default=None)

    @property
    def next_arrival(self) -> int | None:
        return self._arrivals[self._next][0] if self._next < len(self._arrivals) else None

    @property
    def to_arrive(self) -> int:
        return len(self._arrivals) - self._next


def _revealable(req: LoopReq) -> bool:
    """A fresh request (not one retracted, which lost its KV): the cache's match applies."""
    return req.output_len == 0


def _reveal(req: LoopReq, prefix: int, locked: int | None) -> None:
    if prefix > 0 and _revealable(req):
        req.prefix_len = min(prefix, req.input_len - 1)  # sglang always leaves one token to compute
        # The rest of the match is shared with running requests (protected, not evictable).
        req.prefix_cached = None if locked is None else min(locked, req.prefix_len)
    elif not _revealable(req) and prefix < req.prefix_len:
        # Requeued: what its prefills inserted, less what the server's tree had evicted since.
        req.prefix_len = prefix
        req.prefix_cached = None if locked is None else min(locked, prefix)
