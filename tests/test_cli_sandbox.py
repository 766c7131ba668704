"""`schedtrace sandbox` as a user runs it: the console script serves until Ctrl-C and exits 0; a
server that dies under it is one error line and exit 2. Its bad options are tests/test_cli.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from schedtrace.tracer.sandbox.process import group_members, pid_alive

START_TIMEOUT_S = 300

pytestmark = [pytest.mark.own_server, pytest.mark.timeout(900)]


def _terminal_sigint() -> None:
    """Ctrl-C's signal as a terminal delivers it: a shell starts a background job with SIGINT ignored,
    and a test run from one would pass that on to the sandbox, which then never hears the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(script: Path, tmp_path: Path) -> tuple[subprocess.Popen, str, int]:
    """``schedtrace sandbox`` tracing into tmp_path/traces; the URL it prints once ready, and the
    pid of the server it started (the leader of the server's own process group)."""
    proc = subprocess.Popen([str(script), "sandbox", "--trace-dir", str(tmp_path / "traces"),
                             "--log", str(tmp_path / "server.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_sigint)
    said = []
    while not (said and said[-1].startswith("ready in")):  # "ready in N s; pid P", then the URL
        said.append(proc.stderr.readline())
        assert said[-1], ("".join(said), proc.poll())
    url = proc.stdout.readline().strip()  # stdout carries only the URL
    assert url.startswith("http://127.0.0.1:"), (url, proc.poll())
    return proc, url, int(said[-1].rsplit("pid", 1)[1])


def stop(proc: subprocess.Popen, server: int) -> None:
    """Whatever a failed test left running."""
    if proc.poll() is None:
        proc.kill()
    try:
        os.killpg(server, signal.SIGKILL)
    except ProcessLookupError:
        pass


def generate(url: str) -> dict:
    body = json.dumps({"input_ids": list(range(10, 60)), "sampling_params": {"max_new_tokens": 4}}).encode()
    request = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.load(reply)


def test_sandbox_serves_until_ctrl_c_then_stops_every_process_and_exits_0(tmp_path: Path, schedtrace_script: Path) -> None:
    proc, url, server = start(schedtrace_script, tmp_path)
    try:
        assert len(generate(url)["output_ids"]) == 4
        members = group_members(server)
        assert len(members) >= 3  # the launcher, and sglang's scheduler and detokenizer
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        stop(proc, server)
    assert proc.returncode == 0, err[-3000:]
    assert err.rstrip().endswith("stopped") and "Traceback" not in err
    assert not any(pid_alive(pid) for pid in members)
    assert any((tmp_path / "traces").rglob("*.trace"))


def test_a_server_that_dies_under_the_sandbox_command_is_one_error_and_exit_2(tmp_path: Path, schedtrace_script: Path) -> None:
    proc, url, server = start(schedtrace_script, tmp_path)
    try:
        members = group_members(server)
        os.kill(server, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        stop(proc, server)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err
    error = next(line for line in err.splitlines() if line.startswith("schedtrace: error:"))
    assert "sglang server exited unexpectedly" in error and str(tmp_path / "server.log") in error
    assert not any(pid_alive(pid) for pid in members)  # its children did not outlive it (zombies of init aside)
