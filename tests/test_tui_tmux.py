"""``schedtrace tui`` in a real terminal: tmux runs it, we send keys and read the pane, as a person would,
at 120 and 200 columns."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.report import load_report

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux not found: install it (apt-get install -y tmux)")


SOCKET = f"schedtrace-test-{time.monotonic_ns()}"  # our own tmux server: no user config, no other sessions
BACKGROUND = re.compile(r"\x1b\[([0-9;]*)m")


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


def _list_rows(pane: str) -> list[str]:
    """The pass list's lines, top to bottom (between its column header and the footer)."""
    lines = pane.splitlines()
    top = next(i for i, line in enumerate(lines) if re.search(r"pass\s+time\s+wait", line)) + 1
    return lines[top:-1]


def _is_row(row: str, pass_no: int) -> bool:
    return re.match(rf"^\W*(◆|✖|≠|▒|▽)?\s*┃?\s*{pass_no}\s", row) is not None


def _row_of(rows: list[str], pass_no: int) -> int:
    return next(i for i, row in enumerate(rows) if _is_row(row, pass_no))


def _backgrounds(line: str) -> set[str]:
    """The background colours a line of ``capture-pane -e`` sets."""
    found = set()
    for params in BACKGROUND.findall(line):
        codes = params.split(";")
        for i, code in enumerate(codes):
            if code == "48" and i + 1 < len(codes):
                found.add(";".join(codes[i + 1:i + 3] if codes[i + 1] == "5" else codes[i + 1:i + 5]))
    return found


def _assert_centred(session: str, pass_no: int, deadline_s: float = 30.0) -> None:
    """``pass_no``'s line is in the middle of the list (waiting for a closing prompt to be painted over)."""
    end = time.monotonic() + deadline_s
    while True:
        pane = _tmux("capture-pane", "-p", "-t", session)
        rows = _list_rows(pane)
        at = next((i for i, row in enumerate(rows) if _is_row(row, pass_no)), None)
        if at is not None or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert at is not None and abs(at - len(rows) // 2) <= 1, f"pass {pass_no} is on list line {at}:\n{pane}"


@pytest.mark.parametrize("width, height", [(120, 40), (200, 50)])
def test_tui_in_tmux(tmp_path, width, height, schedtrace_script):
    trace, report_path = tmp_path / "t.trace", tmp_path / "t.json"
    generate(trace, 800, seed=2, report_path=report_path)
    report = load_report(report_path)
    stall = min(report.stalls["stock"], key=lambda s: s.start_pass)
    first = min(d.pass_ for d in report.divergences if d.pass_ > stall.start_pass)
    session = f"schedtrace-tui-{time.monotonic_ns()}"
    # tmux may hand the command a COLUMNS/LINES of its default 80x24 window, which would win over the
    # pane's real size: the terminal's own size is what a person's shell gives.
    command = f"env -u COLUMNS -u LINES {schedtrace_script} tui {trace} --report {report_path}"
    _tmux("new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command)
    try:
        pane = _wait_for(session, "replay stock")
        header = pane.splitlines()[0]
        assert "tiny-llama" in header and "passes 800" in header  # one line, even at 120 columns
        _wait_for(session, "events")  # the charts, once the scan is done
        _tmux("send-keys", "-t", session, "s")
        pane = _wait_for(session, f"stall of stock: passes {stall.start_pass}–{stall.end_pass}")
        _assert_centred(session, stall.start_pass)
        # The stall's passes are banded: a gutter bar and a background the passes around them lack.
        rows = _list_rows(pane)
        inside, outside = _row_of(rows, stall.start_pass + 1), _row_of(rows, stall.start_pass - 1)
        assert "┃" in rows[inside] and "┃" not in rows[outside]
        coloured = _list_rows(_tmux("capture-pane", "-p", "-e", "-t", session))
        assert _backgrounds(coloured[inside]) - _backgrounds(coloured[outside])
        _tmux("send-keys", "-t", session, "n")
        pane = _wait_for(session, f"Pass {first} ")
        assert "fixes responsible" in pane
        _assert_centred(session, first)
        _tmux("send-keys", "-t", session, "g")
        _wait_for(session, "Go to pass")
        _tmux("send-keys", "-t", session, "4", "2", "1", "Enter")
        _wait_for(session, "Pass 421 ")
        _assert_centred(session, 421)
        _tmux("send-keys", "-t", session, "q")
        end = time.monotonic() + 30
        while time.monotonic() < end and session in _tmux("list-sessions", "-F", "#{session_name}", check=False):
            time.sleep(0.2)
        quit_cleanly = session not in _tmux("list-sessions", "-F", "#{session_name}", check=False)
    finally:
        _tmux("kill-server", check=False)
    assert quit_cleanly, "q did not quit"


def test_tui_in_tmux_switches_ranks_and_jumps_to_a_desync(tmp_path, schedtrace_script):
    """``schedtrace tui DIR --stall-passes 3`` on a two-rank run: the CLI opens every rank, ] switches,
    d lands centred on the pass where rank 1 decided otherwise."""
    from test_tui_ranks import ALTERED, write_run  # tests/ is on sys.path

    folder = write_run(tmp_path / "run")
    session = f"schedtrace-tui-ranks-{time.monotonic_ns()}"
    command = f"env -u COLUMNS -u LINES {schedtrace_script} tui {folder} --stall-passes 3"
    _tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "44", command)
    try:
        _wait_for(session, "rank tp0 1/2")
        _wait_for(session, "DESYNC 2 passes")
        _tmux("send-keys", "-t", session, "]")
        _wait_for(session, "rank tp1 2/2")
        _wait_for(session, "events")  # tp1's scan is done
        _tmux("send-keys", "-t", session, "d")
        pane = _wait_for(session, f"desync at pass {ALTERED[0]}")
        assert "ranks disagree (tp): this rank differs from tp0" in pane
        _assert_centred(session, ALTERED[0])
        _tmux("send-keys", "-t", session, "q")
    finally:
        _tmux("kill-server", check=False)
