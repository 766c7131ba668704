"""What a closed loop started mid-trace has in flight under sglang's overlap scheduler.

Under ``event_loop_overlap`` a pass is decided before the last step's results
are processed, so the running rows of the recorded start pass show each
request's outputs one short where that step's forward ran it: its newest
token is in flight (``LoopReq.inflight``), and its KV already holds the
slot that step decoded into. Which requests that forward ran follows from
the pass before the start: its prefill batch (its admissions and chunk;
with mixed chunk the running batch too), or, when it built none or the
scheduler idled in between, the decode of every running request. Pure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopState
    from schedtrace.tracer.contract.schema import Pass


def last_forward(previous: Pass | None, mixed_chunk: bool) -> set[str] | None:
    """The requests the forward before the start ran; None: every running request (a decode)."""
    if previous is None or previous.error is not None:
        return None
    admitted = {a.rid for a in previous.admitted}  # the continuing chunk's too
    return None if mixed_chunk or not admitted else admitted


def mark_in_flight(state: LoopState, previous: Pass | None, *, mixed_chunk: bool) -> None:
    """Each running request of ``state`` the last forward ran gets its newest output in flight."""
    ran = last_forward(previous, mixed_chunk)
    for req in state.running:
        if ran is None or req.rid in ran or req.output_len == 0:
            req.output_len += 1
            req.inflight = 1
            if req.kv_tokens < req.input_len + req.output_len - 1:  # the slot that forward decoded into
                req.kv_tokens += 1
                req.kv_held += 1
