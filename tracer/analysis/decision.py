"""Turn a recorded pass into replay inputs and its recorded decision.

The recorder (tracer/recorder.py) writes a pass's outputs with the same
meaning ``PassDriver`` gives a ``Decision``: ``admitted`` in admission order
with the continuing chunk first, ``chunk`` from ``add_chunked_req`` and the
budget ``available_chunk_tokens`` returned inside it, ``new_chunked_rid`` the
scheduler's chunked request after the pass when it is a new one, and
``batch_is_full_out`` of the returned running batch (False when it raised).
"""

from __future__ import annotations

import msgspec

from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import Pass


def recorded_decision(p: Pass) -> Decision:
    """The decision the recorded pass made, in ``Decision`` form."""
    chunk = p.chunk
    return Decision(
        admitted=[(a.rid, a.extend_len) for a in p.admitted],
        chunk_budget=chunk.budget if chunk is not None else None,
        chunk_size=chunk.size if chunk is not None else None,
        new_chunked_rid=p.new_chunked_rid,
        batch_is_full=p.batch_is_full_out,
        error=p.error,
        queue_order=p.order,
    )


def replay_inputs(p: Pass) -> Pass:
    """``p`` with each candidate's prefix match of this pass on its waiting row.

    The schema defines ``WaitingReq.prefix_len`` as the match of this pass
    for candidates; a waiting row taken at pass entry still holds the match
    of an earlier pass, and the candidate rows hold the one the pass made.
    """
    if not p.candidates:
        return p
    matched = {c.rid: c.prefix_len for c in p.candidates}
    if all(matched.get(w.rid, w.prefix_len) == w.prefix_len for w in p.waiting):
        return p
    waiting = [
        msgspec.structs.replace(w, prefix_len=matched[w.rid]) if w.rid in matched else w
        for w in p.waiting
    ]
    return msgspec.structs.replace(p, waiting=waiting)
