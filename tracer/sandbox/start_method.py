"""How a sandbox server starts its scheduler and detokenizer processes.

sglang sets the ``spawn`` start method, because a process that has touched
CUDA cannot be forked. The sandbox never touches CUDA, so its server forks
them from the launcher instead: a forked child runs the same function on the
same arguments, with the modules its launcher imported, and skips the sglang
import a spawned one pays again: a start takes 0.42x the CPU and 0.63x the
time to healthy (``bench/bench_sandbox_start.py``, docs/performance.md). The
start method decides nothing the scheduler reads.

``SCHEDTRACE_SANDBOX_START_METHOD=spawn`` keeps sglang's own.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping
from typing import Final

from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import START_METHOD_ENV

FORK: Final = "fork"
SPAWN: Final = "spawn"  # sglang's own
DEFAULT_START_METHOD: Final = FORK


def chosen(environ: Mapping[str, str] = os.environ) -> str:
    """The start method ``environ`` asks for; a value that is neither fails in one line."""
    method = environ.get(START_METHOD_ENV) or DEFAULT_START_METHOD
    if method not in (FORK, SPAWN):
        raise UsageError(f"{START_METHOD_ENV}={method!r}: expected {FORK!r} or {SPAWN!r}")
    return method


def install_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """In a server process: turn sglang's ``set_start_method("spawn")`` into fork, unless told not to."""
    if chosen(environ) == SPAWN:
        return
    real = multiprocessing.set_start_method

    def set_start_method(method: str, force: bool = False) -> None:
        real(FORK if method == SPAWN else method, force=force)

    multiprocessing.set_start_method = set_start_method
