"""One word for what a pass did: the outcome vocabulary every view uses."""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.contract.schema import Pass

# Most serious first; the TUI's result codes index this tuple.
OUTCOMES: Final = ("none", "admit", "chunk", "full", "no-token", "error")


def pass_outcome(p: Pass) -> str:
    """The first outcome that holds: error, admit, chunk, full, no-token, none."""
    if p.error:
        return "error"
    if p.admitted:
        return "admit"
    if p.chunk is not None and p.chunk.size:
        return "chunk"
    if p.batch_is_full_out:
        return "full"
    if any(c.result == "NO_TOKEN" for c in p.candidates):
        return "no-token"
    return "none"
