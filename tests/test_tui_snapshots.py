"""SVG snapshots of the browser (pytest-textual-snapshot).

Regenerate after an intended change with
``pytest tests/test_tui_snapshots.py --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.report import load_report
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tui.app import TraceApp

SIZE = (140, 40)
LPM = Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace"


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("snap")
    path, report_path = directory / "snap.trace", directory / "snap.json"
    generate(path, 600, seed=11, report_path=report_path)
    return path, report_path


async def _settle(pilot, ready=lambda app: True) -> None:
    """Wait until no worker runs and ``ready(app)`` holds, on three looks in a row 20 ms apart:
    workers start after a refresh (call_after_refresh), so one idle look can come before them."""
    app = pilot.app
    idle = 0
    for _ in range(500):  # at most about 10 s
        busy = any(worker.is_running for worker in app.workers) or not ready(app)
        idle = 0 if busy else idle + 1
        if idle == 3:
            return
        await pilot.pause(0.02)
    raise AssertionError("the app did not settle: a worker still runs, or what the test waits for never came")


def _app(trace) -> TraceApp:
    return TraceApp(TraceReader(trace[0]), report=load_report(trace[1]))


def test_main_screen_with_replay_on_a_divergence(snap_compare, trace):
    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("n", "n")
        await _settle(pilot)

    assert snap_compare(_app(trace), terminal_size=SIZE, run_before=run_before)


def test_request_view(snap_compare, trace):
    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("slash", *"r0000040", "enter", "r")
        await _settle(pilot)

    assert snap_compare(_app(trace), terminal_size=SIZE, run_before=run_before)


def test_lpm_latch_stall_at_120_columns(snap_compare):
    """The recorded lpm sample on its one-pass latch stall: the KV stack with the head's need, the
    queue over time, the stall band and the why line (``stall_passes=1``, as ``--stall-passes 1``)."""

    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("s")
        await _settle(pilot)

    app = TraceApp(TraceReader(LPM), stall_passes=1)
    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_stall_bands_at_200_columns(snap_compare, trace):
    """A planted stall of the old arm: its band in the list and the charts, and the why column."""

    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("s", "j", "j")
        await _settle(pilot)

    assert snap_compare(_app(trace), terminal_size=(200, 50), run_before=run_before)


def test_help_and_legend(snap_compare, trace):
    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("question_mark")
        await _settle(pilot)

    assert snap_compare(_app(trace), terminal_size=SIZE, run_before=run_before)


def test_desync_on_rank_two_of_two(snap_compare, tmp_path):
    """Two ranks of a run, on tp1 (of two parts) at its second desync: the header's rank and verdict,
    the ≠ mark in the list and the timeline, the differing fields in the detail pane."""
    from test_tui_ranks import app_for, write_run  # tests/ is on sys.path

    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press("right_square_bracket")
        await _settle(pilot)
        await pilot.press("d", "d")
        await _settle(pilot)

    app, traces = app_for([write_run(tmp_path / "run")])
    with traces:
        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_gap_in_a_damaged_copy(snap_compare, tmp_path):
    """A damaged copy of a sample at its gap: the header's DAMAGED, the lost passes' lines, the gap in
    the detail pane, the loss and gap marks in the timeline."""
    from test_tui_ranks import app_for, write_damaged

    async def run_before(pilot) -> None:
        await _settle(pilot, ready=lambda app: bool(app.gaps))  # x jumps to the gap only once it is found
        await pilot.press("x", "x")
        await _settle(pilot)

    path = tmp_path / "damaged.trace"
    write_damaged(path)
    app, traces = app_for([path])
    with traces:
        assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
