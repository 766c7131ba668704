"""Local worker processes (schedtrace.replay.scale.executor.LocalExecutor) stop whatever signal
handlers their parent installed: Ray's driver, a recorder and sglang each install one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# The parent's SIGTERM handler never returns (as a recorder's close would not, in a forked
# worker without its writer thread), so a worker that kept it would never stop.
SCRIPT = textwrap.dedent("""
    import signal, threading
    from schedtrace.replay.scale.executor import LocalExecutor

    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Event().wait())
    items = list(range(-8, 0))
    done = list(LocalExecutor(2).map(abs, items))
    assert done == [abs(i) for i in items], done
    for first in LocalExecutor(2).map(abs, items):  # left early: the pool is torn down
        break
    assert first == 8, first
    print("stopped")
""")


def test_workers_stop_though_the_parent_handles_sigterm_forever():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped"


# One worker is slow to start (a loaded machine): the caller leaves on the other's first result, so
# the pool's terminate reaches the slow one before its initializer reset the handlers.
SLOW_START = textwrap.dedent("""
    import os, signal, sys, threading, time
    from schedtrace.replay.scale import executor

    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Event().wait())
    reset, flag = executor._default_stop_signals, sys.argv[1]

    def slow_for_one():
        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
            time.sleep(3)  # the first worker to start
        except FileExistsError:
            pass
        reset()

    executor._default_stop_signals = slow_for_one
    for first in executor.LocalExecutor(2).map(abs, list(range(-8, 0))):
        break
    print("stopped")
""")


def test_a_worker_told_to_stop_before_it_reset_its_handlers_stops(tmp_path):
    done = subprocess.run([sys.executable, "-c", SLOW_START, str(tmp_path / "first")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped"
