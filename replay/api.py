"""Library entry point for open-loop replay (the TUI runs it in a worker thread)."""

from __future__ import annotations

import os

from replay.engine import DivergenceCallback, ProgressCallback, replay_trace
from replay.report import Report
from replay.stalls import DEFAULT_MIN_PASSES


def run_replay(
    path: str | os.PathLike[str],
    old: str = "stock",
    new: str = "fixed",
    *,
    on_progress: ProgressCallback | None = None,
    on_divergence: DivergenceCallback | None = None,
    stall_passes: int = DEFAULT_MIN_PASSES,
    jobs: int = 1,
) -> Report:
    """Replay ``path`` under ``old`` and ``new``; callbacks run in the calling thread.

    ``on_progress(done, total)`` reports pass records replayed;
    ``on_divergence(d)`` is called for each divergence as it is found.
    Raises ``SchedtraceError`` subclasses for bad input or variants.
    """
    return replay_trace(
        path,
        old,
        new,
        stall_passes=stall_passes,
        jobs=jobs,
        on_progress=on_progress,
        on_divergence=on_divergence,
    )
