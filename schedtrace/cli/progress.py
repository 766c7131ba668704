"""What a long command shows while it works: a spinner, a bar over passes or requests, and one over Ray tasks.

Only on a terminal: when stderr is a pipe or a file (tests, CI, ``2>log``)
nothing is drawn, so captured output stays exactly the command's own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

# The first schedtrace module that imports sglang (about 12 s on a cold start).
SGLANG_ENTRY = "schedtrace.replay.driver"

ProgressCallback = Callable[[int, int], None]  # (passes or requests done, total), as replay.engine calls it
TaskCallback = Callable[[int, int, int], None]  # (tasks done, submitted, retried), as replay.scale.executor calls it


class Activity:
    """One transient line on stderr: ``with Activity() as act: act.phase(...)``."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True) if console is None else console
        self.enabled = console.is_terminal
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(), console=console, transient=True, disable=not self.enabled,
        )
        self._task = None

    def __enter__(self) -> Activity:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def phase(self, description: str) -> None:
        """Start a step of unknown length (spinner and pulsing bar)."""
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(description, total=None, count="")

    def import_sglang(self) -> None:
        """Import sglang now, under a spinner, rather than silently inside the first step."""
        self.phase("importing sglang")
        importlib.import_module(SGLANG_ENTRY)

    def passes(self, description: str) -> ProgressCallback:
        """Start a step over passes; the returned callback moves the bar."""
        return self._counted(description, "passes")

    def requests(self, description: str) -> ProgressCallback:
        """Start a step over requests (a re-drive); the returned callback moves the bar."""
        return self._counted(description, "requests")

    def _counted(self, description: str, unit: str) -> ProgressCallback:
        self.phase(description)
        task = self._task

        def on_progress(done: int, total: int) -> None:
            self._progress.update(task, total=max(total, 1), completed=done, count=f"{done}/{total} {unit}")

        return on_progress

    def tasks(self, description: str) -> TaskCallback:
        """A bar of its own over every task a distributed backend runs, across all the steps."""
        task = self._progress.add_task(description, total=None, count="")

        def on_task(done: int, submitted: int, retried: int) -> None:
            again = f", {retried} retried" if retried else ""
            self._progress.update(task, total=max(submitted, 1), completed=done,
                                  count=f"{done}/{submitted} tasks{again}")

        return on_task
