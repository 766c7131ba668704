"""`make demo`, the README's quick start, as a new user runs it: the console script, on a clean
output folder, re-drives the shipped workload on a stock and a fixed server and ends in exit 0.
Its bad options are tests/test_cli.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from schedtrace.tracer.contract.names import FIXED, STOCK
from schedtrace.tracer.contract.report import load_report

pytestmark = [pytest.mark.own_server, pytest.mark.timeout(900)]


def test_the_demo_replays_a_live_stock_and_fixed_run_and_exits_0(tmp_path: Path, schedtrace_script: Path) -> None:
    out = tmp_path / "demo"
    done = subprocess.run([str(schedtrace_script), "demo", "--out", str(out)], capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == f"demo done; everything is in {out}"
    for arm in (STOCK, FIXED):  # both runs traced and replayed; stock's replay reproduced the recording
        assert any((out / "traces" / arm).glob("*.trace")), arm
        report = load_report(out / f"{arm}-replay.json")
        assert report.fidelity.total > 0
    stock = load_report(out / f"{STOCK}-replay.json")
    assert stock.fidelity.matched == stock.fidelity.total
    # It ends by naming what to browse, and that command's files exist.
    tui = next(line.split() for line in lines if " tui " in line)
    assert Path(tui[2]).is_file() and Path(tui[tui.index("--report") + 1]).is_file()
