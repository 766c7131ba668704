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
moves on to it after each step. Without the pipeline there is none; how many
there are is ``capacity.micro_batches``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopReq, LoopState

@dataclass
class MicroBatch:
    """A micro-batch waiting for its turn: its running batch and its latch."""

    running: list[LoopReq] = field(default_factory=list)
    batch_is_full: bool = False

    def copy(self) -> MicroBatch:
        return MicroBatch([replace(r) for r in self.running], self.batch_is_full)


def rotate(state: LoopState) -> None:
    """The next micro-batch takes its turn; the one that ran waits last."""
    if not state.parked:
        return
    state.parked.append(MicroBatch(state.running, state.batch_is_full))
    turn = state.parked.pop(0)
    state.running, state.batch_is_full = turn.running, turn.batch_is_full
