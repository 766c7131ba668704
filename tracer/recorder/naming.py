"""The run id every rank of one server start shares, and trace file names that never collide.

Run id: the plugin's ``register()`` runs in the launching process first
(``Engine.__init__`` loads the plugins before it spawns the tokenizer
manager, the DP controller and the schedulers), and sets ``SCHEDTRACE_RUN_ID``
there when it is unset. Every process sglang starts afterwards inherits the
environment, so every rank reads the same id without talking to the others
and however the process tree is shaped. A value the operator set is kept
(cut to ``RUN_ID_LIMIT`` safe characters): that is how the ranks of a
multi-node server, whose launchers are separate processes, share one id.
sglang loads the plugin once per process, so two ``Engine`` starts in one
Python process share an id as well (their files still never collide).

File names: ``schedtrace-{run}-{host}-tp{T}-dp{D}-pp{P}-pid{PID}.part{NNN}.trace``.
A part is created with ``O_EXCL``, so an existing file is never opened
again: a name that is taken (a restarted container reusing the pid and the
run id, two servers writing into one directory under one id) moves this
writer to the first free ``{stem}.dup{N}`` stem for this and later parts.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Final

from schedtrace.tracer.contract.names import PREFIX_KEY_ENV, RUN_ID_ENV
from schedtrace.tracer.contract.prefix_ids import KEY_BYTES
from schedtrace.tracer.recorder.ranks import Ranks

RUN_ID_LIMIT: Final = 64
HOST_LIMIT: Final = 32
MAX_DUPLICATES: Final = 1000  # stems tried before giving up on a directory
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(text: str, limit: int) -> str:
    """``text`` as one file-name component: safe characters only, at most ``limit`` of them."""
    return _UNSAFE.sub("_", text).strip("._")[:limit]


def new_run_id() -> str:
    """UTC start time (sortable) and 24 random bits (two starts in one second differ)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()


def ensure_run_id(environ: MutableMapping[str, str] = os.environ) -> str:
    """This process's run id: the inherited (or operator-set) one, else a new one, published to children."""
    run_id = safe_name(environ.get(RUN_ID_ENV, ""), RUN_ID_LIMIT)
    if not run_id:
        run_id = new_run_id()
    environ[RUN_ID_ENV] = run_id
    return run_id


def ensure_prefix_key(environ: MutableMapping[str, str] = os.environ) -> bytes:
    """The run's prefix-id secret: the inherited (or operator-set) one, else a new one, published
    to children like the run id. A value that is not hex of 1 to 32 bytes is replaced."""
    try:
        key = bytes.fromhex(environ.get(PREFIX_KEY_ENV, ""))
    except ValueError:
        key = b""
    if not 0 < len(key) <= KEY_BYTES:
        key = os.urandom(KEY_BYTES)
        environ[PREFIX_KEY_ENV] = key.hex()
    return key


def trace_stem(run_id: str, ranks: Ranks, pid: int, host: str | None = None) -> str:
    """The file name stem of one scheduler process's trace parts."""
    host = safe_name(host if host is not None else socket.gethostname(), HOST_LIMIT) or "host"
    run = f"{run_id}-" if run_id else ""
    return f"schedtrace-{run}{host}-tp{ranks['tp_rank']}-dp{ranks['dp_rank'] or 0}-pp{ranks['pp_rank']}-pid{pid}"


def part_name(stem: str, part: int) -> str:
    return f"{stem}.part{part:03d}.trace"


def claim_part(directory: Path, stem: str, part: int, first_dup: int = 0) -> tuple[int, Path]:
    """Create part ``part`` as a new, empty file; returns (its duplicate number, its path).

    Tries ``stem`` (duplicate 0), then ``stem.dup1``, ``stem.dup2``, ... from
    ``first_dup`` and raises ``FileExistsError`` after ``MAX_DUPLICATES``;
    other ``OSError``s pass through.
    """
    for dup in range(first_dup, MAX_DUPLICATES):
        path = directory / part_name(stem if dup == 0 else f"{stem}.dup{dup}", part)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return dup, path
    raise FileExistsError(f"{directory}: {MAX_DUPLICATES} trace files named {stem}[.dupN].part{part:03d}.trace exist")


def directory_problem(directory: str | os.PathLike) -> str | None:
    """Why ``directory`` cannot hold traces, or None. It is created if missing; a probe file is made and removed."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        return "it is not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    probe = path / f".schedtrace-probe-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(probe)
    except OSError as exc:
        return f"cannot create a file in it: {exc.strerror or exc}"
    return None
