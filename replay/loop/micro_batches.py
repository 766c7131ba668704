"""The pipeline loop's micro-batches (sglang's ``event_loop_pp``).

With ``--pp-size`` above one the scheduler keeps ``pp_size +
pp_async_batch_depth`` running batches and takes them in turn: each pass
decides for one micro-batch, on its own running batch and ``batch_is_full``
latch, while the waiting queue, the chunked request, the pools and the new-token
ratio are shared. A micro-batch's results are processed at the end of the
pass before its next one (``_pp_process_batch_result`` of the next
``mb_id``), after that pass's admission: its finishes free KV for the other
micro-batches one pass later than without the pipeline.

``LoopState.parked`` holds the others, the next to run first; ``rotate``
moves on to it after each step. Without the pipeline there is none.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from schedtrace.tracer.contract.schema import Header

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopReq, LoopState

PP_ASYNC_BATCH_DEPTH = "pp_async_batch_depth"


@dataclass
class MicroBatch:
    """A micro-batch waiting for its turn: its running batch and its latch."""

    running: list[LoopReq] = field(default_factory=list)
    batch_is_full: bool = False

    def copy(self) -> MicroBatch:
        return MicroBatch([replace(r) for r in self.running], self.batch_is_full)

    def key(self) -> tuple:
        return tuple(r.rid for r in self.running), tuple(r.output_len for r in self.running), self.batch_is_full


def loop_size(header: Header) -> int:
    """The micro-batches the scheduler loops over (``init_pp_loop_state``); 1 without the pipeline."""
    if header.pp_size <= 1:
        return 1
    depth = header.settings.get(PP_ASYNC_BATCH_DEPTH)
    return header.pp_size + (depth if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0 else 0)


def parked_at_start(size: int, later: list[list[LoopReq]]) -> list[MicroBatch]:
    """The other micro-batches at the loop's start: each the running requests recorded at its
    next turn (``later[i]``: the pass ``i + 1`` after the start, empty when not recorded)."""
    return [MicroBatch(later[i] if i < len(later) else []) for i in range(size - 1)]


def rotate(state: LoopState) -> None:
    """The next micro-batch takes its turn; the one that ran waits last."""
    if not state.parked:
        return
    state.parked.append(MicroBatch(state.running, state.batch_is_full))
    turn = state.parked.pop(0)
    state.running, state.batch_is_full = turn.running, turn.batch_is_full
