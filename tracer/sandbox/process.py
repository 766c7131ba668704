"""Processes of a sandbox server: free ports, log tails, stopping a whole group.

sglang's scheduler and detokenizer children share the launcher's process
group and outlive a plain kill of the parent, so a server is always stopped
by its group.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

HOST = "127.0.0.1"
DEFAULT_GRACEFUL_STOP_S = 15.0
DEFAULT_STOP_GRACE_S = 10.0
LOG_TAIL_LINES = 40


# sglang derives a DP-attention server's ZMQ ports from its HTTP port
# (``server_args.ZMQ_TCP_PORT_DELTA`` = 233, then up to 7 more), and keeps its
# own NCCL port in 22000-29999; both must be free, and none may be a port the
# kernel hands out to outgoing connections (from ``ip_local_port_range``).
SERVER_PORT_RANGE = (10_000, 21_700)
DERIVED_PORT_OFFSETS = tuple(range(233, 241))
_PORT_ATTEMPTS = 200


def free_port(host: str = HOST) -> int:
    """A server port free now, with sglang's derived ports, below the ephemeral range.

    An OS-picked port (``bind(0)``) is ephemeral: a socket any process opens
    later can take the port 233 above it, as CI saw when a DP-attention server
    found its ``dist_init_port`` held by its own launcher.
    """
    low, high = SERVER_PORT_RANGE
    for port in random.sample(range(low, high), _PORT_ATTEMPTS):
        if all(_bindable(host, port + offset) for offset in (0, *DERIVED_PORT_OFFSETS)):
            return port
    raise OSError(f"no free server port in {low}-{high} after {_PORT_ATTEMPTS} tries")


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


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


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (per /proc)."""
    fields = proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


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
