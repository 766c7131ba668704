"""The browser's handle on its replay child (``replay_child.py``): start it, relay it, end it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from textual.message import Message

from schedtrace.tui.messages import DivergenceFound, ReplayDone, ReplayProgress, WorkerFailed
from schedtrace.tui.replay_child import read_frames

Post = Callable[[Message], object]


class ReplayProcess:
    """``replay_child`` run for one trace and two arms; ``stop`` ends it (and what it started) at once."""

    def __init__(self, paths: Sequence[str | Path], old: str, new: str) -> None:
        self.command = [sys.executable, "-m", "schedtrace.tui.replay_child", old, new, *map(str, paths)]
        self.process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self.ended = threading.Event()  # run() has returned: nothing of the replay is left

    def run(self, post: Post) -> None:
        """Start the child and post what it reports, until it ends (in a thread worker)."""
        try:
            with tempfile.TemporaryFile() as log:  # the child's stderr: sglang's logs must not reach the screen
                with self._lock:
                    if self._stopped:
                        return
                    self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.PIPE, stderr=log, start_new_session=True)
                self._relay(post, log)
        finally:
            self.ended.set()

    def _relay(self, post: Post, log: BinaryIO) -> None:
        process = self.process
        assert process is not None and process.stdout is not None
        ended = False
        for kind, payload in read_frames(process.stdout):
            if kind == "progress":
                post(ReplayProgress(*payload))
            elif kind == "divergence":
                post(DivergenceFound(payload))
            elif kind == "done":
                post(ReplayDone(payload))
                ended = True
            elif kind == "failed":
                post(WorkerFailed("replay", str(payload)))
                ended = True
        code = process.wait()
        if not ended and not self._stopped:
            log.seek(0)
            last = log.read().decode(errors="replace").strip().splitlines()[-1:]
            post(WorkerFailed("replay", f"the replay process ended with status {code}"
                                        + (f": {last[0]}" if last else "")))

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            process = self.process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # its own group: the replay's workers too
            except ProcessLookupError:
                pass
