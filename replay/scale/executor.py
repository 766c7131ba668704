"""Where independent pieces of work run: this process, local worker processes, or Ray.

``Executor.map(fn, items)`` yields ``fn(item)`` for every item, in the
items' order, whatever ran them, so a caller's result is the same for any
backend and job count. ``fn`` must be a module-level function and items and
results picklable (a sweep sends configured loop inputs and gets msgpack
bytes back). ``workers`` is how many items can run at once, ``retried`` how
many tasks a backend ran again after a worker died (0 locally), and
``locate`` says how a trace's files reach the workers (``TraceFiles``).
The Ray backend is ``schedtrace.replay.scale.ray_executor``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from schedtrace.tracer.contract.errors import TraceSetError, UsageError

T = TypeVar("T")
R = TypeVar("R")
TaskCallback = Callable[[int, int, int], None]  # (tasks done, tasks submitted, tasks retried), over every map


@dataclass(frozen=True)
class TraceFiles:
    """One trace's part files as a worker finds them: by path on shared storage, checked by
    size and fingerprint, or (``chunks``: per part, object-store references) by value."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    fingerprints: tuple[str, ...]
    chunks: tuple[tuple[Any, ...], ...] | None = None

    def shipped(self, chunks: tuple[tuple[Any, ...], ...]) -> TraceFiles:
        return replace(self, chunks=chunks)


def trace_files(paths: Sequence[str]) -> TraceFiles:
    """The files of one trace (a rank's parts in order), with what a worker checks them by."""
    from schedtrace.tracer.contract.format import TraceReader

    sizes, prints = [], []
    for path in paths:
        with TraceReader(path, skip_damaged=True) as reader:  # replay reads past damage: so does this
            sizes.append(reader.file_size)
            prints.append(reader.fingerprint())
    return TraceFiles(tuple(str(p) for p in paths), tuple(sizes), tuple(prints))


def readable_here(files: TraceFiles) -> bool:
    """Whether this process sees the very files the driver saw (same path, size and fingerprint)."""
    from schedtrace.tracer.contract.errors import SchedtraceError
    from schedtrace.tracer.contract.format import TraceReader

    for path, size, fingerprint in zip(files.paths, files.sizes, files.fingerprints):
        try:
            with TraceReader(path, skip_damaged=True) as reader:
                if reader.file_size != size or reader.fingerprint() != fingerprint:
                    return False
        except SchedtraceError:
            return False
    return True


@contextmanager
def local_paths(files: TraceFiles) -> Iterator[tuple[str, ...]]:
    """Paths of ``files`` in this process: the shared ones, or a private copy written chunk by
    chunk from the object store (memory bounded by one chunk), removed afterwards."""
    if files.chunks is None:
        if not readable_here(files):
            raise TraceSetError(files.paths[0], "not readable on this worker with the size and "
                                "fingerprint the driver saw; expected shared storage or shipped bytes")
        yield files.paths
        return
    import ray  # chunks exist only on the Ray backend

    folder = tempfile.mkdtemp(prefix="schedtrace-")
    try:
        copies = []
        for path, refs in zip(files.paths, files.chunks):
            copy = os.path.join(folder, os.path.basename(path))
            with open(copy, "wb") as out:
                for ref in refs:
                    out.write(ray.get(ref))
            copies.append(copy)
        yield tuple(copies)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Executor(Protocol):
    workers: int
    retried: int

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``fn(item)`` for each item, yielded in the items' order."""
        ...

    def locate(self, files: TraceFiles) -> TraceFiles:
        """``files`` as every worker can read them."""
        ...


class LocalExecutor:
    """``jobs`` worker processes (1: this process, nothing forked).

    Workers are forked where the platform allows: a parent that imported
    sglang hands it to them already imported.
    """

    retried = 0  # a local worker that dies fails the run

    def __init__(self, jobs: int = 1, on_task: TaskCallback | None = None) -> None:
        if jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {jobs}")
        self.jobs = self.workers = jobs
        self.on_task = on_task
        self._done = self._submitted = 0

    def locate(self, files: TraceFiles) -> TraceFiles:
        return files  # same machine, same files

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        self._submitted += len(items)
        for result in self._results(fn, items):
            self._done += 1
            if self.on_task is not None:
                self.on_task(self._done, self._submitted, 0)
            yield result

    def _results(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        workers = min(self.jobs, len(items))
        if workers <= 1:
            yield from map(fn, items)
            return
        context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        pool = _pool(context, workers)
        try:
            # chunksize 1: cells take seconds each, and uneven ones should not queue behind each other
            yield from pool.imap(fn, items, chunksize=1)
        except BaseException:
            pool.terminate()
            raise
        else:
            pool.close()  # workers leave on their own once the queue is empty: no signal needed
        finally:
            pool.join()


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _pool(context, workers: int):
    """A pool whose workers start with the stop signals blocked until they reset them: a
    ``terminate`` that comes before a worker ran its initializer (the caller left at once,
    on a loaded machine) would otherwise run the parent's handler there, and ``join`` wait
    on it (a CI run hung so)."""
    if not hasattr(signal, "pthread_sigmask"):
        return context.Pool(workers, initializer=_default_stop_signals)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)  # pending, not lost, meanwhile
    try:
        return context.Pool(workers, initializer=_default_stop_signals)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _default_stop_signals() -> None:
    """A forked worker inherits its parent's Python handlers (Ray's driver exits through
    ``sys.exit``, a recorder closes its trace); a worker told to stop must simply stop."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # a terminate sent meanwhile lands now
