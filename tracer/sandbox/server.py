"""The embedded CPU sandbox: the real ``sglang.launch_server`` on a tiny model.

``SandboxServer`` starts the real server (tokenizer manager, scheduler and
detokenizer processes) on CPU with the shipped tiny Llama and dummy weights,
waits until ``/health`` answers 200, and stops the whole process group.
The recorder plugin is switched on only through the environment: the server
gets ``SCHEDTRACE_DIR`` when a trace directory is given and
``SCHEDTRACE_FIXES`` when fixes are given, and neither otherwise.

    with SandboxServer(trace_dir="out/traces", extra_args=KV_PRESSURE_ARGS) as srv:
        requests.post(srv.url + "/generate", json=...)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from schedtrace.tracer.contract.errors import SandboxError, ServerStartError
from schedtrace.tracer.kernel_stub import STUB_DIR

MODEL_DIR = Path(__file__).resolve().parent / "assets" / "tiny-llama"
HOST = "127.0.0.1"

# CPU, tiny model, dummy weights: what the real server needs to run here.
BASE_LAUNCH_ARGS: tuple[str, ...] = (
    "--load-format", "dummy",
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--dtype", "float32",
)

# sglang on CPU sizes the KV pool from free host memory (tens of millions of
# tokens here); a fixed, roomy pool keeps the sandbox small. Placed before the
# caller's arguments, which win because argparse keeps the last value.
DEFAULT_POOL_ARGS: tuple[str, ...] = ("--max-total-tokens", "131072")

# Few running slots, big chunks and a small KV pool: with ~48 concurrent
# 1.5k-4.5k-token prompts the scheduler chunks prefills, runs near full token
# usage and has to queue and retract. This is the load the demo traces.
KV_PRESSURE_ARGS: tuple[str, ...] = (
    "--max-running-requests", "12",
    "--chunked-prefill-size", "8192",
    "--max-total-tokens", "40000",
)

SERVER_ENV: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "CUDA_VISIBLE_DEVICES": "",
}
TRACE_DIR_ENV = "SCHEDTRACE_DIR"
FIXES_ENV = "SCHEDTRACE_FIXES"

DEFAULT_START_TIMEOUT_S = 300.0  # ~40 s alone on 2 cores; 100+ s when shared
DEFAULT_GRACEFUL_STOP_S = 15.0
DEFAULT_STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 40


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


def server_env(
    base: Mapping[str, str],
    trace_dir: Path | None,
    fixes: str | None,
) -> dict[str, str]:
    """The server's environment: CPU engine, kernel stand-in, tracing switches."""
    env = dict(base)
    env.update(SERVER_ENV)
    python_path = [str(STUB_DIR)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    env.pop(TRACE_DIR_ENV, None)
    env.pop(FIXES_ENV, None)
    if trace_dir is not None:
        env[TRACE_DIR_ENV] = str(trace_dir)
    if fixes:
        env[FIXES_ENV] = fixes
    return env


def launch_command(port: int, extra_args: Sequence[str] = (), model_dir: Path = MODEL_DIR) -> list[str]:
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model_dir),
        *BASE_LAUNCH_ARGS,
        "--host", HOST,
        "--port", str(port),
        *DEFAULT_POOL_ARGS,
        *extra_args,
    ]


def stop_process_group(
    proc: subprocess.Popen,
    graceful_s: float = DEFAULT_GRACEFUL_STOP_S,
    grace_s: float = DEFAULT_STOP_GRACE_S,
) -> None:
    """Stop every process in the group ``proc`` leads, and reap ``proc``.

    First SIGTERM to the leader alone: sglang then shuts its schedulers down
    through a ShutdownReq, so they leave their loop and run their finalizers
    (where a recorder flushes). Then SIGTERM to the whole group, then SIGKILL:
    the scheduler and detokenizer children share the group and outlive a
    plain kill of the parent, so a single pid is never enough.
    """
    pgid = proc.pid  # started with start_new_session: it leads its own group
    phases = (
        (lambda: _signal_pid(proc, signal.SIGTERM), graceful_s),
        (lambda: _signal_group(pgid, signal.SIGTERM), grace_s),
        (lambda: _signal_group(pgid, signal.SIGKILL), grace_s),
    )
    for send, wait_s in phases:
        if not process_group_alive(pgid):
            break
        send()
        if _wait_group_gone(proc, pgid, wait_s):
            break
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:  # only if SIGKILL failed; never hang
        pass


def process_group_alive(pgid: int) -> bool:
    """Whether any live process is left in group ``pgid`` (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    return any(pid_alive(pid) for pid in group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (read from /proc; zombies included)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (per /proc)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _signal_pid(proc: subprocess.Popen, sig: signal.Signals) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _wait_group_gone(proc: subprocess.Popen, pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()  # reap the leader so it does not linger as a zombie
        if not process_group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


class SandboxServer:
    """One real sglang server on CPU; a context manager, or ``start()``/``stop()``.

    trace_dir: passed as ``SCHEDTRACE_DIR`` (created if missing); None: no tracing.
    fixes: passed as ``SCHEDTRACE_FIXES`` (e.g. ``"all"``, ``"latch,one-chunk"``).
    port: fixed port, or None for a free one on 127.0.0.1.
    extra_args: more ``sglang.launch_server`` arguments (e.g. ``KV_PRESSURE_ARGS``).
    log_path: where server output goes; default: a fresh temporary directory.
    """

    def __init__(
        self,
        *,
        trace_dir: str | os.PathLike[str] | None = None,
        fixes: str | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        graceful_stop_s: float = DEFAULT_GRACEFUL_STOP_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        model_dir: str | os.PathLike[str] = MODEL_DIR,
    ) -> None:
        self.trace_dir = Path(trace_dir).resolve() if trace_dir is not None else None
        self.fixes = fixes or None
        self.port = port if port is not None else free_port()
        self.extra_args = tuple(extra_args)
        self.log_path = (
            Path(log_path).resolve()
            if log_path is not None
            else Path(tempfile.mkdtemp(prefix="schedtrace-sandbox-")) / "server.log"
        )
        self.start_timeout_s = start_timeout_s
        self.graceful_stop_s = graceful_stop_s
        self.stop_grace_s = stop_grace_s
        self.model_dir = Path(model_dir)
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Pid of the launch_server process, which also leads the process group."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return launch_command(self.port, self.extra_args, self.model_dir)

    def start(self) -> "SandboxServer":
        """Launch and wait until healthy; raises ``ServerStartError`` with the log tail."""
        if self._proc is not None:
            raise SandboxError(f"sandbox server already started (pid {self._proc.pid})")
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = server_env(os.environ, self.trace_dir, self.fixes)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group, so stop() reaches every child
            )
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.start_timeout_s
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"sglang server exited with code {code} before it was healthy; "
                    f"log {self.log_path}, last lines:\n{read_log_tail(self.log_path)}"
                )
            if self._health_ok():
                return
            time.sleep(0.5)
        raise ServerStartError(
            f"sglang server not healthy at {self.url} after {self.start_timeout_s:.0f}s; "
            f"log {self.log_path}, last lines:\n{read_log_tail(self.log_path)}"
        )

    def _health_ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """Stop every process of the server (idempotent)."""
        if self._proc is None:
            return
        stop_process_group(self._proc, self.graceful_stop_s, self.stop_grace_s)

    def __enter__(self) -> "SandboxServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
