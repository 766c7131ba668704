"""The Ray backend of ``Executor``: each item one Ray task, retried when its worker dies.

With no address, Ray starts in this process on this machine (``num_cpus``:
``--jobs``), so ``--ray`` runs on a laptop; with ``--address`` or
``RAY_ADDRESS`` it joins a running cluster. Ray schedules; nothing here
does. Results come back in the items' order, so a report is the same bytes
as a local run's.

A task whose worker dies is run again by Ray (``RAY_MAX_RETRIES`` times);
each task says which attempt it was, so ``retried`` counts the tasks that
needed more than one. An exception the work itself raises is not retried:
it is the run's error, as in a local run. Ctrl-C cancels every outstanding
task (their workers are killed) and shuts down a Ray this process started.

Trace files: on a Ray this process started, workers share this machine's
files. On a cluster, one probe task per node checks each trace's paths
(size and fingerprint); when any node cannot see them, the bytes go
through the object store in ``CHUNK_BYTES`` pieces, read and put one at a
time (``executor.local_paths`` writes them back out in the worker).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from schedtrace.replay.scale.executor import TaskCallback, TraceFiles, readable_here
from schedtrace.tracer.contract.errors import ReplayError, UsageError
from schedtrace.tracer.contract.names import RAY_ADDRESS_ENV, RAY_MAX_RETRIES

T = TypeVar("T")
R = TypeVar("R")

CHUNK_BYTES = 8 << 20  # one object-store piece of a shipped trace: the driver's memory bound
OBJECT_STORE_BYTES = 256 << 20  # a Ray started here: small, the machine is shared
WAIT_S = 0.2  # how often the driver wakes to move the bar and to see Ctrl-C
INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'schedtrace[ray]'"


def ray_missing() -> bool:
    """Whether ``import ray`` would fail, found without importing it (about 1 s)."""
    import importlib.util
    import sys

    if "ray" in sys.modules:
        return sys.modules["ray"] is None  # None: imports of it are blocked
    return importlib.util.find_spec("ray") is None


def import_ray():
    """``ray``, or the one-line error naming the extra."""
    try:
        import ray
    except ModuleNotFoundError:
        raise UsageError(INSTALL_HINT) from None
    return ray


def _token_auth_if_available() -> None:
    """Join a cluster that ``ray start`` began with token auth (its default) using the token it saved
    (~/.ray/auth_token), as Ray's own CLI does; RAY_AUTH_MODE, when set, decides instead."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token auth
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _attempt(fn: Callable[[T], R], item: T, arms: bytes = b"") -> tuple[int, R]:
    """Run in a Ray worker: ``fn(item)`` with the attempt number (0 first, 1 a retry, ...).

    ``arms``: the user arms the driver loaded (their text: a worker may not see the files),
    registered here first so the arm labels in ``item`` resolve."""
    import ray

    if arms:
        from schedtrace.arms.user import install_shipped

        install_shipped(arms)
    attempt = ray._private.worker.global_worker.core_worker.get_current_task_attempt_number()
    return attempt, fn(item)


class RayExecutor:
    """Items as Ray tasks on a cluster (``address``) or on a Ray started here (``jobs`` CPUs)."""

    def __init__(self, address: str | None = None, *, jobs: int | None = None, on_task: TaskCallback | None = None,
                 max_retries: int = RAY_MAX_RETRIES, ship_files: bool | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        address = address or os.environ.get(RAY_ADDRESS_ENV) or None
        self.started = not ray.is_initialized()
        if self.started:
            local = address is None
            if not local:
                _token_auth_if_available()
            # "local": a new Ray here, never a cluster some other `ray start` on this machine left running.
            ray.init(address="local" if local else address, num_cpus=(jobs or os.cpu_count() or 1) if local else None,
                     object_store_memory=OBJECT_STORE_BYTES if local else None, include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
        self.shared_machine = address is None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.retried = 0
        self.on_task = on_task
        self.ship_files = ship_files  # None: probe; True/False: tests and benches force one way
        self.max_retries = max_retries
        self._task = ray.remote(max_retries=max_retries)(_attempt)
        self._done = self._submitted = 0
        self._located: dict[TraceFiles, TraceFiles] = {}

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut down the Ray this executor started (a cluster's stays up)."""
        if self.started and self._ray.is_initialized():
            self._ray.shutdown()
        self.started = False

    # ----------------------------------------------------------------- files

    def locate(self, files: TraceFiles) -> TraceFiles:
        if files not in self._located:
            ship = self.ship_files
            if ship is None:
                ship = not self.shared_machine and not all(self._probe(files))
            self._located[files] = files.shipped(self._put_chunks(files)) if ship else files
        return self._located[files]

    def _probe(self, files: TraceFiles) -> list[bool]:
        """Whether each alive node sees ``files`` (one small task pinned to each)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = self._ray.remote(num_cpus=0)(readable_here)
        nodes = [n["NodeID"] for n in self._ray.nodes() if n.get("Alive")]
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(files)
                for node in nodes]
        return self._ray.get(refs)

    def _put_chunks(self, files: TraceFiles) -> tuple[tuple[Any, ...], ...]:
        parts = []
        for path in files.paths:
            refs = []
            with open(path, "rb") as file:
                while chunk := file.read(CHUNK_BYTES):
                    refs.append(self._ray.put(chunk))
            parts.append(tuple(refs))
        return tuple(parts)

    # ------------------------------------------------------------------ work

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        from schedtrace.arms.user import shipped

        ray = self._ray
        arms = shipped()  # msgpack of every user arm loaded here ([] when none)
        arms_ref = ray.put(arms) if len(arms) > 1 else b""
        refs = [self._task.remote(fn, item, arms_ref) for item in items]
        self._submitted += len(refs)
        pending = list(refs)
        try:
            self._report()
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=WAIT_S)
                self._done += len(ready)
                self._report()
            results = [self._result(ref) for ref in refs]
        except KeyboardInterrupt:
            self.cancel(refs)
            raise
        for attempt, result in results:
            self.retried += attempt > 0  # counted as each result is handed out: a caller can attribute it
            yield result
        self._report()

    def cancel(self, refs: Sequence[Any]) -> None:
        """Stop every task of ``refs`` that is still queued or running (its worker is killed)."""
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # already finished or already gone: nothing to stop
                pass
        self.close()

    def _result(self, ref: Any) -> tuple[int, Any]:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            raise cause if isinstance(cause, Exception) else ReplayError(str(exc)) from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as exc:
            raise ReplayError(f"a Ray task failed after {self.max_retries} retries: "
                              f"{type(exc).__name__}") from None

    def _report(self) -> None:
        if self.on_task is not None:
            self.on_task(self._done, self._submitted, self.retried)
