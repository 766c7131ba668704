"""Pure comparisons of decisions: arm vs arm (divergence) and recording vs replay (fidelity)."""

from __future__ import annotations

from schedtrace.tracer.contract.report import (DIVERGENCE_KINDS, KIND_ADMITTED, KIND_AITER, KIND_BATCH_IS_FULL,
                                               KIND_CHUNK, KIND_ERROR, KIND_NEW_CHUNKED, KIND_OVER_ASK, Decision)

# Decision fields a recorded pass holds, in report order.
FIDELITY_FIELDS = ("admitted", "chunk_budget", "chunk_size", "new_chunked_rid", "batch_is_full", "error")


def _error_type(error: str | None) -> str | None:
    return None if error is None else error.partition(":")[0]


def divergence_kinds(old: Decision, new: Decision) -> list[str]:
    """How two arms' decisions on one pass differ, in ``DIVERGENCE_KINDS`` order."""
    differs = {
        KIND_ADMITTED: old.admitted != new.admitted,
        KIND_CHUNK: old.chunk_size != new.chunk_size,
        KIND_BATCH_IS_FULL: old.batch_is_full != new.batch_is_full,
        KIND_NEW_CHUNKED: old.new_chunked_rid != new.new_chunked_rid,
        KIND_AITER: old.aiter_method != new.aiter_method,
        KIND_OVER_ASK: (old.over_ask > 0) != (new.over_ask > 0),
        KIND_ERROR: _error_type(old.error) != _error_type(new.error),
    }
    return [kind for kind in DIVERGENCE_KINDS if differs[kind]]


def fidelity_fields(recorded: Decision, replayed: Decision) -> list[str]:
    """Fields where the replay disagrees with the recording (errors compare by type)."""
    out = []
    for name in FIDELITY_FIELDS:
        a, b = getattr(recorded, name), getattr(replayed, name)
        if name == "error":
            a, b = _error_type(a), _error_type(b)
        if a != b:
            out.append(name)
    return out


def order_matches(recorded: Decision, replayed: Decision) -> bool:
    """calc_priority left the queue in the recorded order (a pass that raised compares too)."""
    return recorded.queue_order == replayed.queue_order


def aiter_fidelity_fields(recorded_method: str, replayed: Decision) -> list[str]:
    return [] if recorded_method == replayed.aiter_method else ["aiter_method"]
