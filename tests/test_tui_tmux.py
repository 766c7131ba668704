"""``schedtrace tui`` in a real terminal: tmux runs it, we send keys and read the pane."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from schedtrace.tracer.contract.synthetic import generate
from schedtrace.tracer.contract.report import load_report

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux not found: install it (apt-get install -y tmux)")
SCHEDTRACE = Path(sys.executable).with_name("schedtrace")


SOCKET = f"schedtrace-test-{time.monotonic_ns()}"  # our own tmux server: no user config, no other sessions


def _tmux(*args: str, check: bool = True) -> str:
    return subprocess.run([TMUX, "-L", SOCKET, "-f", "/dev/null", *args], check=check, capture_output=True,
                          text=True, timeout=30).stdout


def _wait_for(session: str, text: str, deadline_s: float = 60.0) -> str:
    """Poll the pane until ``text`` shows (a wait, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    pane = ""
    while time.monotonic() < end:
        pane = _tmux("capture-pane", "-p", "-t", session)
        if text in pane:
            return pane
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared; last pane:\n{pane}")


def test_tui_in_tmux(tmp_path):
    trace, report_path = tmp_path / "t.trace", tmp_path / "t.json"
    generate(trace, 800, seed=2, report_path=report_path)
    first = min(d.pass_ for d in load_report(report_path).divergences)
    session = f"schedtrace-tui-{time.monotonic_ns()}"
    command = f"{SCHEDTRACE} tui {trace} --report {report_path}"
    _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "45", command)
    try:
        pane = _wait_for(session, "replay stock")
        assert "tiny-llama" in pane and "passes 800" in pane
        _wait_for(session, "events")  # the timeline, once the scan is done
        _tmux("send-keys", "-t", session, "n")
        pane = _wait_for(session, f"Pass {first} ")
        assert "fixes responsible" in pane
        _tmux("send-keys", "-t", session, "g")
        _wait_for(session, "Go to pass")
        _tmux("send-keys", "-t", session, "4", "2", "1", "Enter")
        _wait_for(session, "Pass 421 ")
        _tmux("send-keys", "-t", session, "q")
        end = time.monotonic() + 30
        while time.monotonic() < end and session in _tmux("list-sessions", "-F", "#{session_name}", check=False):
            time.sleep(0.2)
        quit_cleanly = session not in _tmux("list-sessions", "-F", "#{session_name}", check=False)
    finally:
        _tmux("kill-server", check=False)
    assert quit_cleanly, "q did not quit"
