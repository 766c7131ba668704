"""The policy matrix: one sandbox configuration per scheduler policy and path, each recorded.

Every configuration (``CONFIGS``) serves the load of ``schedtrace.testing.load``
and records one trace; tests/test_policy_matrix.py replays each. Record one
alone with ``python -m schedtrace.testing.matrix NAME OUT_DIR``.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.testing.load import ABORT_POLL_ENV, policy_requests, run
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Header
from schedtrace.tracer.sandbox.models import model as find_model
from schedtrace.tracer.sandbox.server import SandboxServer

BASE_ARGS = ("--max-running-requests", "4", "--chunked-prefill-size", "1024", "--max-total-tokens", "12000")
PRIORITY = ("--enable-priority-scheduling",)


@dataclass(frozen=True)
class Config:
    name: str
    args: tuple[str, ...]
    model: str = "llama"
    pp: int = 1  # pipeline stages; each records a trace, and the first stage's is replayed
    env: dict[str, str] = field(default_factory=dict)
    priorities: bool = False
    routing: bool = False
    # sglang fits its chunk sizer to a start-up profile of real prefill latencies, and turns dynamic
    # chunking off when noise makes the fit's quadratic term negative: such a start is served again
    needs_chunk_sizer: bool = False


CONFIGS = (
    # lpm with mixed chunks, a per-pass request cap and a queue limit that rejects
    Config("lpm", ("--schedule-policy", "lpm", "--enable-mixed-chunk", "--prefill-max-requests", "3",
                   "--max-queued-requests", "6")),
    # dfs-weight under sglang's retraction test hook, two decode steps per pass
    Config("dfs-weight", ("--schedule-policy", "dfs-weight", "--num-continuous-decode-steps", "2"),
           env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "7"}),
    Config("hrrn", ("--schedule-policy", "hrrn")),
    Config("shortest-prefill-first", ("--schedule-policy", "shortest-prefill-first")),
    Config("random", ("--schedule-policy", "random")),
    Config("routing-key", ("--schedule-policy", "routing-key"), routing=True),
    # priorities, no preemption
    Config("lof-priority", ("--schedule-policy", "lof", *PRIORITY, "--disable-priority-preemption"), priorities=True),
    # priorities, low values first, preempting at any priority difference
    Config("fcfs-low-first", ("--schedule-policy", "fcfs", *PRIORITY, "--schedule-low-priority-values-first",
                              "--priority-scheduling-preemption-threshold", "0"), priorities=True),
    Config("mamba-lpm", ("--schedule-policy", "lpm"), model="hybrid-mamba"),
    # the hybrid pools under priority preemption, retraction and a queue limit; 12 mamba slots cap the
    # batch at 4, so it fills and preempts (at 8, one CI run never preempted)
    Config("mamba-priority", ("--schedule-policy", "fcfs", *PRIORITY, "--schedule-low-priority-values-first",
                              "--priority-scheduling-preemption-threshold", "0", "--max-queued-requests", "6",
                              "--max-mamba-cache-size", "12"),
           model="hybrid-mamba", env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "7"},
           priorities=True),
    # chunks sized by sglang's latency-fitted sizer, which runs only with pipeline stages; the
    # wide-vocab llama lets its start-up profile prefill ids below 10,000
    Config("dynamic-chunking", ("--schedule-policy", "lpm", "--enable-dynamic-chunking"),
           model="llama-wide-vocab", pp=2, needs_chunk_sizer=True),
)


@dataclass
class Recorded:
    config: Config
    trace: Path
    outcomes: dict[str, str]


def server_for(config: Config, folder: Path, base_env: Mapping[str, str] | None = None) -> SandboxServer:
    """``config``'s sandbox, recording into ``folder/traces``, over ``base_env`` (default: this process's)."""
    hybrid = find_model(config.model).hybrid is not None
    args = () if hybrid else BASE_ARGS
    return SandboxServer(model=config.model, pp=config.pp, overload=hybrid, trace_dir=folder / "traces",
                         extra_args=(*args, *config.args), log_path=folder / "server.log",
                         env={**ABORT_POLL_ENV, **config.env}, base_env=base_env)


RECORD_ATTEMPTS = 3  # starts for a configuration whose server must fit its chunk sizer


def record(config: Config, base: Path, base_env: Mapping[str, str] | None = None) -> Recorded:
    """Serve the load on ``config``'s sandbox, recording into ``base/NAME/traces``."""
    for _ in range(RECORD_ATTEMPTS):
        recorded = _record_once(config, base, base_env)
        if not config.needs_chunk_sizer or _header(recorded.trace).chunk_sizer is not None:
            break
    return recorded  # after the last attempt, as it is: the matrix test says what did not run


def _record_once(config: Config, base: Path, base_env: Mapping[str, str] | None) -> Recorded:
    folder = base / config.name
    shutil.rmtree(folder, ignore_errors=True)  # one trace per configuration
    server = server_for(config, folder, base_env)
    with server:
        outcomes = run(server.url, policy_requests(config.name, priorities=config.priorities, routing=config.routing))
    traces = sorted((folder / "traces").glob("*.trace"))
    assert len(traces) == config.pp, traces  # a trace per rank
    return Recorded(config, next(t for t in traces if _header(t).pp_rank == 0), outcomes)


def _header(trace: Path) -> Header:
    with TraceReader(trace) as reader:
        return reader.header


class MatrixRecording:
    """Every configuration recorded, one server at a time, from ``start`` on in a background thread;
    ``result`` records the rest beside it (two at a time) and returns them all by name.

    A test session starts it while the tests that need no server run, on the core their one
    thread leaves idle (tests/conftest.py), so the matrix costs little wall time of its own. Its
    servers inherit the environment as it was when the recording was made (``base_env``): a
    setting a test patches into ``os.environ`` meanwhile must not reach a server starting beside it."""

    def __init__(self, base: Path, configs: tuple[Config, ...] = CONFIGS) -> None:
        self.base = base
        self.base_env = dict(os.environ)
        self._todo: queue.SimpleQueue[Config] = queue.SimpleQueue()
        for config in configs:
            self._todo.put(config)
        self._done: dict[str, Recorded | BaseException] = {}
        self._thread = threading.Thread(target=self._drain, name="matrix-recording", daemon=True)
        self._names = [c.name for c in configs]
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                config = self._todo.get_nowait()
            except queue.Empty:
                return
            try:
                self._done[config.name] = record(config, self.base, self.base_env)
            except BaseException as exc:  # handed to result(), in the test that needs it
                self._done[config.name] = exc

    def cancel(self) -> None:
        """Record no more; wait for the server now recording to stop (no server outlives the session)."""
        while True:
            try:
                self._todo.get_nowait()
            except queue.Empty:
                break
        if self._started:
            self._thread.join()

    def result(self) -> dict[str, Recorded]:
        self.start()
        self._drain()
        self._thread.join()
        for name in self._names:
            if isinstance(self._done[name], BaseException):
                raise RuntimeError(f"the {name} sandbox failed to record") from self._done[name]
        return {name: self._done[name] for name in self._names}  # type: ignore[misc]


if __name__ == "__main__":
    by_name = {c.name: c for c in CONFIGS}
    if len(sys.argv) != 3 or sys.argv[1] not in by_name:
        sys.exit(f"usage: python -m schedtrace.testing.matrix {{{','.join(by_name)}}} OUT_DIR")
    done = record(by_name[sys.argv[1]], Path(sys.argv[2]))
    print(done.trace)
