"""The embedded CPU sandbox: the real ``sglang.launch_server`` on a tiny model.

``SandboxServer`` starts the real server (tokenizer manager, scheduler and
detokenizer processes; one scheduler per rank with ``tp``/``dp``) on CPU
with a tiny dummy-weight model from the registry
(``schedtrace.tracer.sandbox.models``), waits until ``/health`` answers
200, and stops the whole process group. Every server process gets the
``sgl_kernel`` import stand-in and the stand-ins its model needs through a
``sitecustomize`` on ``PYTHONPATH``. The recorder plugin is switched on
only through the environment: the server gets ``SCHEDTRACE_DIR`` when a
trace directory is given and ``SCHEDTRACE_FIXES`` when fixes are given,
and neither otherwise.

    with SandboxServer(model="hybrid-mamba", trace_dir="out/traces", extra_args=KV_PRESSURE_ARGS) as srv:
        requests.post(srv.url + "/generate", json=...)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from schedtrace.arms.variants import absolute_variant
from schedtrace.tracer.contract.errors import SandboxError, ServerStartError, UsageError
from schedtrace.tracer.contract.names import DIR_ENV, FIXES_ENV, SGLANG_CPU_ENGINE_ENV
from schedtrace.tracer.sandbox.models import KV_PRESSURE_ARGS, DEFAULT_MODEL, SandboxModel, model as find_model
from schedtrace.tracer.sandbox.process import (
    DEFAULT_GRACEFUL_STOP_S,
    DEFAULT_STOP_GRACE_S,
    HOST,
    free_port,
    read_log_tail,
    stop_process_group,
)
from schedtrace.tracer.sandbox.standins import STANDINS_ENV, env_value
from schedtrace.tracer.sandbox.start_method import chosen as chosen_start_method

SITE_DIR = Path(__file__).resolve().parent / "site"  # its sitecustomize arms the stand-ins
MODEL_DIR = find_model(DEFAULT_MODEL).model_dir  # the default model's folder (config + tokenizer)

# CPU, tiny model, dummy weights: what the real server needs to run here.
BASE_LAUNCH_ARGS: tuple[str, ...] = (
    "--load-format", "dummy",
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--dtype", "float32",
    # An idle scheduler polls its sockets instead of spinning: a spinning one holds a core
    # (1.01 cores measured) that the other servers and the tests on these 2 cores need.
    "--sleep-on-idle",
)

# sglang on CPU sizes the KV pool from free host memory (tens of millions of
# tokens here); a fixed, roomy pool keeps the sandbox small. Placed before the
# caller's arguments, which win because argparse keeps the last value.
DEFAULT_POOL_ARGS: tuple[str, ...] = ("--max-total-tokens", "131072")

SERVER_ENV: dict[str, str] = {
    SGLANG_CPU_ENGINE_ENV: "1",
    "CUDA_VISIBLE_DEVICES": "",
}
# sglang on CPU asserts this is set for more than one rank: the cores each rank's OpenMP threads use.
THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
# One OpenMP thread per process unless the caller sets more: the tiny models' ops are too small to
# split, and a second thread spinning between them took 10-15 s of CPU per matrix server (80 s against
# 66-76 s), CPU the other servers and tests sharing these cores need. Decides nothing.
OMP_THREADS_ENV = "OMP_NUM_THREADS"
DEFAULT_OMP_THREADS = "1"

DEFAULT_START_TIMEOUT_S = 300.0  # ~40 s alone on 2 cores; 100+ s when shared


def threads_bind(ranks: int, cores: Sequence[int]) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``ranks``: an equal share of ``cores`` each.

    ``"0|1"`` for two ranks on two cores; ranks share a core when there are more ranks than cores.
    """
    cores = sorted(cores)
    if ranks >= len(cores):
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    share = len(cores) // ranks
    groups = [cores[i * share:(i + 1) * share] for i in range(ranks)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


def server_env(
    base: Mapping[str, str],
    trace_dir: Path | None,
    fixes: str | None,
    stand_ins: Sequence[str] = (),
    ranks: int = 1,
) -> dict[str, str]:
    """The server's environment: CPU engine, stand-ins, rank binding, tracing switches."""
    env = dict(base)
    env.update(SERVER_ENV)
    env.setdefault(OMP_THREADS_ENV, DEFAULT_OMP_THREADS)
    chosen_start_method(env)  # a bad value fails here, in one line, not in every server process
    python_path = [str(SITE_DIR)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    env[STANDINS_ENV] = env_value(stand_ins)
    if ranks > 1:
        env.setdefault(THREADS_BIND_ENV, threads_bind(ranks, sorted(os.sched_getaffinity(0))))
    env.pop(DIR_ENV, None)
    env.pop(FIXES_ENV, None)
    if trace_dir is not None:
        env[DIR_ENV] = str(trace_dir)
    if fixes:
        # Arm files by absolute path: the server's processes may start elsewhere. A file that
        # does not apply fails here, in one line, before the server starts.
        env[FIXES_ENV] = fixes if fixes == "all" else absolute_variant(fixes)
    return env


def rank_args(tp: int, dp: int, pp: int = 1) -> tuple[str, ...]:
    """``--tp``/``--dp``/``--pp-size`` flags; DP here is DP attention, which needs ``tp >= dp``."""
    if tp < 1 or dp < 1 or pp < 1:
        raise UsageError(f"sandbox ranks must be >= 1, got tp={tp} dp={dp} pp={pp}")
    args: tuple[str, ...] = ("--tp", str(tp)) if tp > 1 else ()
    if pp > 1:
        args += ("--pp-size", str(pp))
    if dp > 1:
        if tp % dp:
            raise UsageError(f"DP attention needs tp to be a multiple of dp, got tp={tp} dp={dp}")
        args += ("--dp", str(dp), "--enable-dp-attention")
    return args


def launch_command(
    port: int,
    extra_args: Sequence[str] = (),
    sandbox_model: SandboxModel | None = None,
    tp: int = 1,
    dp: int = 1,
    pp: int = 1,
) -> list[str]:
    entry = sandbox_model or find_model(DEFAULT_MODEL)
    return [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(entry.model_dir),
        *BASE_LAUNCH_ARGS,
        *entry.launch_args,
        *rank_args(tp, dp, pp),
        "--host", HOST,
        "--port", str(port),
        *DEFAULT_POOL_ARGS,
        *extra_args,
    ]


class SandboxServer:
    """One real sglang server on CPU; a context manager, or ``start()``/``stop()``.

    model: a registry name (``schedtrace.tracer.sandbox.models.MODELS``): ``"llama"``
        (default), ``"hybrid-mamba"``, ``"hybrid-swa"``.
    tp: tensor-parallel ranks (one scheduler process each, each recording its own trace).
    dp: DP-attention ranks (``--dp N --enable-dp-attention``); tp is raised to dp if lower.
    pp: pipeline stages (``--pp-size N``), each of tp ranks, each rank recording its own trace.
    stand_in_forward: stand in for the model forward even where the real one runs (speed).
    overload: add the model's overload arguments (``SandboxModel.overload_args``) before extra_args.
    trace_dir: passed as ``SCHEDTRACE_DIR`` (created if missing); None: no tracing.
    fixes: passed as ``SCHEDTRACE_FIXES`` (e.g. ``"all"``, ``"latch,one-chunk"``, ``"./mine.diff"``).
    port: fixed port, or None for a free one on 127.0.0.1.
    extra_args: more ``sglang.launch_server`` arguments (e.g. ``KV_PRESSURE_ARGS``); they win.
    log_path: where server output goes; default: a fresh temporary directory.
    env: more environment variables for the server (e.g. sglang's ``SGLANG_TEST_RETRACT``).
    base_env: the environment the server inherits; default: this process's when it starts.
    """

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        tp: int = 1,
        dp: int = 1,
        pp: int = 1,
        stand_in_forward: bool = False,
        overload: bool = False,
        trace_dir: str | os.PathLike[str] | None = None,
        fixes: str | None = None,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        graceful_stop_s: float = DEFAULT_GRACEFUL_STOP_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        env: Mapping[str, str] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.model = find_model(model)
        self.env = dict(env or {})
        self.base_env = base_env
        self.dp = dp
        self.tp = max(tp, dp)
        self.pp = pp
        rank_args(self.tp, self.dp, self.pp)  # bad ranks fail here, not in the server
        self.stand_in_forward = stand_in_forward
        self.trace_dir = Path(trace_dir).resolve() if trace_dir is not None else None
        self.fixes = fixes or None
        self.port = port if port is not None else free_port()
        self.extra_args = (self.model.overload_args if overload else ()) + tuple(extra_args)
        self.log_path = (
            Path(log_path).resolve()
            if log_path is not None
            else Path(tempfile.mkdtemp(prefix="schedtrace-sandbox-")) / "server.log"
        )
        self.start_timeout_s = start_timeout_s
        self.graceful_stop_s = graceful_stop_s
        self.stop_grace_s = stop_grace_s
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def model_dir(self) -> Path:
        """The model folder: its config.json and the tokenizer a load client needs."""
        return self.model.model_dir

    @property
    def stand_ins(self) -> tuple[str, ...]:
        """The stand-ins armed in every server process (beyond the sgl_kernel import)."""
        return self.model.stand_ins_for(self.tp, self.dp, self.stand_in_forward, self.pp)

    def describe(self) -> str:
        """The model, what runs real and what is stood in for, at this server's ranks."""
        return self.model.describe(self.stand_ins)

    @property
    def pid(self) -> int | None:
        """Pid of the launch_server process, which also leads the process group."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return launch_command(self.port, self.extra_args, self.model, self.tp, self.dp, self.pp)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The server's environment over ``base`` (default: ``base_env``, else this process's)."""
        if base is None:
            base = os.environ if self.base_env is None else self.base_env
        return server_env({**base, **self.env}, self.trace_dir, self.fixes, self.stand_ins, self.tp * self.pp)

    def start(self) -> "SandboxServer":
        """Launch and wait until healthy; raises ``ServerStartError`` with the log tail."""
        if self._proc is not None:
            raise SandboxError(f"sandbox server already started (pid {self._proc.pid})")
        if self.trace_dir is not None:
            self.trace_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
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
                    f"sglang server ({self.model.name}) exited with code {code} before it was healthy; "
                    f"log {self.log_path}, last lines:\n{read_log_tail(self.log_path)}"
                )
            if self._health_ok():
                return
            time.sleep(0.5)
        raise ServerStartError(
            f"sglang server ({self.model.name}) not healthy at {self.url} after {self.start_timeout_s:.0f}s; "
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


__all__ = [
    "BASE_LAUNCH_ARGS", "DEFAULT_POOL_ARGS", "KV_PRESSURE_ARGS", "MODEL_DIR", "SandboxServer",
    "free_port", "launch_command", "read_log_tail", "server_env", "stop_process_group",
]
