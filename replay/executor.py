"""Where independent pieces of work run: this process, or local worker processes.

``Executor.map(fn, items)`` yields ``fn(item)`` for every item, in the
items' order, whatever ran them, so a caller's result is the same for any
backend and job count. ``fn`` must be a module-level function and items and
results picklable (a sweep sends configured loop inputs and gets msgpack
bytes back). Another backend (Ray) only has to provide ``map``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from schedtrace.tracer.contract.errors import UsageError

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``fn(item)`` for each item, yielded in the items' order."""
        ...


class LocalExecutor:
    """``jobs`` worker processes (1: this process, nothing forked).

    Workers are forked where the platform allows: a parent that imported
    sglang hands it to them already imported.
    """

    def __init__(self, jobs: int = 1) -> None:
        if jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {jobs}")
        self.jobs = jobs

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        workers = min(self.jobs, len(items))
        if workers <= 1:
            yield from map(fn, items)
            return
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        with context.Pool(workers) as pool:
            # chunksize 1: cells take seconds each, and uneven ones should not queue behind each other
            yield from pool.imap(fn, items, chunksize=1)
