"""Fresh pytest processes without paying sglang's import in each: forked from one that paid it once.

Importing sglang's scheduler takes about 12 s of the 17 s a one-test
``python -m pytest`` process takes here, and ``repro`` verifies in one
process per variant. So one server process imports sglang (untouched: no
fix, no arm) and forks a child per run; each child is a process of its
own, so a fix or an arm it applies never reaches another, exactly as with
separate ``python -m pytest`` processes. The child sets the run's folder and
environment, sends its output to a file, and runs ``pytest.main``.

The protocol is JSON lines (never pickle): on stdin ``{"id", "cwd", "env",
"argv", "out"}``; on stdout ``{"ready": true}`` once, then ``{"id", "pid"}``
when a child starts and ``{"id", "rc"}`` when it ends. Children are
watched through pidfds, so any number run at once.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from importlib.metadata import entry_points
from pathlib import Path
from typing import IO, Final

# What the emitted tests import; the rest each child imports itself.
PRELOAD: Final = ("pytest", "sglang.srt.managers.scheduler", "sglang.test.test_utils",
                  "schedtrace.replay.loop.run")
START_TIMEOUT_S: Final = 300.0


def _child(request: dict) -> None:
    """In the forked child: become the run, then leave without running the server's cleanup."""
    code = 70
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # never read the server's requests
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        sys.argv = ["pytest", *request["argv"]]
        import pytest

        code = int(pytest.main(list(request["argv"])))
    except BaseException as exc:  # noqa: BLE001 - reported in the run's output, then the exit code
        print(f"schedtrace fork server: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(preload: Sequence[str] = PRELOAD) -> None:
    """The server's loop: import ``preload``, then fork a child per request line, report each child's end."""
    from schedtrace.replay.sglang_env import ensure_sglang_importable

    ensure_sglang_importable()
    for name in preload:
        importlib.import_module(name)
    for plugin in entry_points(group="pytest11"):  # pytest loads them in each child: about 3 s
        try:
            plugin.load()
        except Exception:  # noqa: BLE001 - the child loads it again and reports what fails
            pass

    gc.freeze()  # children share these objects untouched; pytest's gc.collect at exit then skips them (2 s)
    reply = sys.stdout
    reply.write('{"ready": true}\n')
    reply.flush()
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (request id, pid)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    pending = b""  # read unbuffered: a buffered reader could hold a line the selector never reports
    reading = True
    while reading or children:
        for key, _ in selector.select():
            if key.fd == 0:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    selector.unregister(0)
                    reading = False
                    continue
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    request = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        _child(request)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = (request["id"], pid)
                    selector.register(pidfd, selectors.EVENT_READ)
                    reply.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
            else:
                request_id, pid = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                reply.write(json.dumps({"id": request_id, "rc": os.waitstatus_to_exitcode(status)}) + "\n")
            reply.flush()
    os._exit(0)  # nothing to clean up: skip tearing down sglang's modules (about 2.5 s)


class ForkServer:
    """The client: ``run`` a pytest process from the server, from any thread.

    ``start`` returns False when the server cannot start (no ``fork`` or
    ``pidfd_open`` here, or sglang fails to import in it); callers then
    run ``python -m pytest`` processes as before."""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        self.preload = tuple(preload)
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._pids: dict[int, Future[int]] = {}
        self._ends: dict[int, Future[int]] = {}

    def start(self) -> bool:
        if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
            return False
        self._process = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "schedtrace.replay.repro.forkserver", *self.preload], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready: Future[bool] = Future()
        threading.Thread(target=self._read, args=(self._process.stdout, ready), daemon=True).start()
        try:
            if ready.result(timeout=START_TIMEOUT_S):
                return True
        except TimeoutError:
            pass
        self.close()
        return False

    def _read(self, stream: IO[str], ready: Future[bool]) -> None:
        for line in stream:
            message = json.loads(line)
            if "ready" in message:
                ready.set_result(True)
            elif "pid" in message:
                self._pids.pop(message["id"]).set_result(message["pid"])
            else:
                self._ends.pop(message["id"]).set_result(message["rc"])
        if not ready.done():
            ready.set_result(False)
        for waiting in (*self._pids.values(), *self._ends.values()):
            waiting.set_exception(OSError("the fork server stopped"))

    def run(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], out: Path, timeout: float) -> int | None:
        """The child's exit code, or None when it ran past ``timeout`` (it is killed)."""
        assert self._process is not None and self._process.stdin is not None
        pid_of: Future[int] = Future()
        end: Future[int] = Future()
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            self._pids[request_id], self._ends[request_id] = pid_of, end
            request = {"id": request_id, "cwd": str(cwd), "env": dict(env), "argv": list(argv), "out": str(out)}
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        pid = pid_of.result(timeout=START_TIMEOUT_S)
        try:
            return end.result(timeout=timeout)
        except TimeoutError:
            os.kill(pid, 9)
            end.result(timeout=START_TIMEOUT_S)
            return None

    def close(self) -> None:
        if self._process is None:
            return
        if self._process.stdin is not None:
            self._process.stdin.close()  # the server exits once its children have
        try:
            self._process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    serve(sys.argv[1:] or PRELOAD)
