"""The trace browser driven through Textual's Pilot, plus its pure view model.

Traces come from schedtrace.testing.synthetic (deterministic, with planted stalls,
failed allocations and one raising pass) and its matching replay report.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable

from schedtrace.testing.synthetic import generate
from schedtrace.tracer.contract.report import load_report
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tui.app import KEYS, PANES, TraceApp
from schedtrace.tui.model.diff import decision_diff
from schedtrace.tui.widgets.charts import Chart
from schedtrace.tui.widgets.detail import DetailPane
from schedtrace.tui.widgets.help import pane_keys
from schedtrace.tui.widgets.pass_list import PassList
from schedtrace.tui.widgets.screens import RequestScreen

PASSES = 1200
SIZE = (150, 44)

pytestmark = pytest.mark.anyio  # async tests run on asyncio through anyio's pytest plugin


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tui")
    path, report_path = directory / "t.trace", directory / "t.json"
    generate(path, PASSES, seed=3, report_path=report_path)
    return path, report_path


def make_app(trace: tuple[Path, Path], *, with_report: bool = True) -> TraceApp:
    path, report_path = trace
    report = load_report(report_path) if with_report else None
    return TraceApp(TraceReader(path), report=report)


async def settle(app: TraceApp, pilot) -> None:
    """Let the scan and timeline workers finish and their messages land."""
    for _ in range(3):
        while any(worker.is_running for worker in app.workers):
            await pilot.pause(0.02)
        await pilot.pause()


def detail_text(app: TraceApp) -> str:
    from rich.console import Console

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(app.query_one(DetailPane).renderable)
    return console.export_text()


async def test_n_and_N_walk_the_divergences(trace):
    app = make_app(trace)
    report = load_report(trace[1])
    passes = sorted(d.pass_ for d in report.divergences)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.selected == 0
        await pilot.press("n")
        assert app.selected == passes[0]
        await pilot.press("n")
        assert app.selected == passes[1]
        await pilot.press("N")
        assert app.selected == passes[0]
        text = detail_text(app)
        divergence = next(d for d in report.divergences if d.pass_ == passes[0])
        assert f"Pass {passes[0]}" in text
        assert "fixes responsible: " + ", ".join(divergence.fixes) in text
        changed = [d.name for d in decision_diff(divergence.old, divergence.new) if d.differs]
        assert changed and all(f"≠ {name}" in text for name in changed)
        assert "stock" in text and "fixed" in text
        assert app.query_one(PassList).selected_pass == passes[0] == app.detail_pass


def notices(app: TraceApp) -> list[str]:
    return [notification.message for notification in app._notifications]


async def test_n_past_the_last_divergence_and_N_before_the_first_stay_and_say_so(trace):
    app = make_app(trace)
    passes = sorted(d.pass_ for d in load_report(trace[1]).divergences)
    assert 0 < passes[0] and len(passes) > 1  # a pass before the first to stand on
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("N")  # at pass 0, before the first
        await pilot.pause()
        assert app.selected == 0 and "No earlier divergence." in notices(app)
        await pilot.press("n")
        assert app.selected == passes[0]
        await pilot.press("N")  # on the first one
        await pilot.pause()
        assert app.selected == passes[0] and notices(app).count("No earlier divergence.") == 2
        app.select_pass(passes[-1])
        await pilot.press("n")  # on the last one
        await pilot.pause()
        assert app.selected == passes[-1] and "No later divergence." in notices(app)
        await pilot.press("N")
        assert app.selected == passes[-2]
        assert app.query_one(PassList).selected_pass == passes[-2] == app.detail_pass


async def test_stall_and_error_keys(trace):
    app = make_app(trace)
    report = load_report(trace[1])
    stall_starts = sorted(s.start_pass for s in report.stalls["stock"])
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("s")
        assert app.selected == stall_starts[0]
        await pilot.press("s")
        assert app.selected == stall_starts[1]
        await pilot.press("S")
        assert app.selected == stall_starts[0]
        assert "inside a stall" in detail_text(app)
        # The raising pass is the only error in the report; failed allocs also count as errors.
        error_pass = report.errors["stock"][0].pass_
        for _ in range(50):
            await pilot.press("e")
            if app.selected == error_pass:
                break
        assert app.selected == error_pass
        assert "✖ raised: AssertionError" in detail_text(app)


async def test_errors_include_failed_allocations(trace):
    app = make_app(trace, with_report=False)
    with TraceReader(trace[0]) as reader:
        failed = sorted(r.pass_seq for _, r in reader.records() if getattr(r, "ok", True) is False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("e")
        assert app.selected == failed[0]
        assert "a KV allocation failed" in detail_text(app)


async def test_trace_alone_finds_recorded_stalls_and_refuses_divergence_jumps(trace):
    app = make_app(trace, with_report=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.scan is not None and app.scan.stalls, "the planted latch windows are recorded stalls"
        await pilot.press("s")
        assert app.selected == app.scan.stalls[0][0]
        await pilot.press("n")
        assert app.selected == app.scan.stalls[0][0]  # no replay: n does not move
        await pilot.pause()
        assert any("No replay loaded" in str(n.message) for n in app._notifications)


async def test_goto_pass_and_out_of_range(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("g", *"777", "enter")
        assert app.selected == 777
        assert "Pass 777" in detail_text(app)
        await pilot.press("g", *"99999", "enter")
        assert app.selected == 777
        await pilot.press("g", *"abc", "enter")
        assert app.selected == 777


async def test_find_rid_then_request_view(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        rid = "r0000100"
        span = app.scan.rids[rid]
        await pilot.press("slash", *rid, "enter")
        assert app.selected == span.first_pass
        await pilot.press("r")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, RequestScreen) and screen.rid == rid
        states = [step.state for step in screen.steps]
        assert states[0] == "arrived" and "waiting" in states and "admitted" in states
        assert states[-1] == "finished"
        table = screen.query_one(DataTable)
        assert table.row_count == len(screen.steps)
        # enter on a step jumps back to that pass on the main screen
        table.move_cursor(row=states.index("admitted"))
        admitted_pass = screen.steps[states.index("admitted")].first
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, RequestScreen)
        assert app.selected == admitted_pass


async def test_filters_and_their_inverse(trace):
    app = make_app(trace)
    report = load_report(trace[1])
    divergent = sorted(d.pass_ for d in report.divergences)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        pass_list = app.query_one(PassList)
        await pilot.press("f", *"divergent", "enter")
        await settle(app, pilot)
        assert pass_list.row_count == len(divergent)
        assert [pass_list.pass_of(i) for i in range(pass_list.row_count)] == divergent
        await pilot.press("f", *"!divergent", "enter")
        await settle(app, pilot)
        assert pass_list.row_count == PASSES - len(divergent)
        assert divergent[0] not in {pass_list.pass_of(i) for i in range(pass_list.row_count)}
        await pilot.press("f", *"fix latch", "enter")
        await settle(app, pilot)
        latch = [d.pass_ for d in report.divergences if "latch" in d.fixes]
        assert pass_list.row_count == len(latch)
        await pilot.press("f", *"result error", "enter")
        await settle(app, pilot)
        assert pass_list.row_count == 1
        assert pass_list.pass_of(0) == report.errors["stock"][0].pass_
        await pilot.press("f", "enter")  # empty clears
        await settle(app, pilot)
        assert pass_list.row_count == PASSES


async def test_moving_on_the_pass_list_and_the_charts(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "down", "pagedown")
        assert app.selected > 2
        await pilot.press("end")
        assert app.selected == PASSES - 1
        chart = app.query_one("#kv-chart", Chart)
        data, image = chart.data, chart.image
        assert data is not None and image is not None and data.axis.columns == image.columns
        # Click the KV chart's 10th column, on its plot (offsets count from the chart's border).
        border = chart.content_region.x - chart.region.x
        await pilot.click("#kv-chart", offset=(border + image.left + 1 + 10, 1 + image.top + 1))
        await pilot.pause()
        assert app.selected == data.axis.pass_at(10)
        chart.focus()
        before = app.selected
        await pilot.press("l")
        await pilot.pause()
        assert app.selected > before
        await pilot.press("h")
        await pilot.pause()
        assert app.selected < app.listed.count


async def test_a_chart_build_for_replaced_marks_is_dropped_when_it_lands_last(trace):
    """Thread workers run to the end though a newer build replaced (cancelled) them, so the older can
    land last: the charts it drew (without the replay's marks here) must not replace the newer ones."""
    from schedtrace.tui import workers
    from schedtrace.tui.messages import FromWorker
    from schedtrace.tui.model.marks import build_marks
    from schedtrace.tui.model.replay_index import ReplayIndex

    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        shown = app.chart_data
        assert shown is not None and app.marks.divergence
        width, height = app._chart_size
        stale = build_marks(app.scan, ReplayIndex(None))
        landed: list = []
        workers.build_charts(app.shared, app.scan, stale, width, height, landed.append)
        (message,) = landed
        assert message.data != shown  # the stale build draws something else: the test can see a swap
        builder = app.run_worker(lambda: None, thread=True, group="charts")
        await builder.wait()
        builder.cancel()  # as a newer build of its group cancels it
        app.post_message(FromWorker(builder, message))
        await settle(app, pilot)
        assert app.chart_data is shown
        # The same build from a worker not cancelled lands: the drop is the cancellation's.
        app.post_message(FromWorker(app.run_worker(lambda: None, thread=True), message))
        await settle(app, pilot)
        assert app.chart_data is message.data


async def test_help_and_command_palette_list_every_key_and_a_legend(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {description for _, _, description in KEYS} <= titles
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "HelpScreen"
        text = app.screen.text.plain
        for _, widget in PANES:
            for keys, what in pane_keys(widget):
                assert f"{keys:<16}{what}" in text
        for word in ("admit", "chunk", "full", "no-token", "none", "error", "latch", "back-pressure",
                     "stalled passes of stock", "stalled passes of fixed", "◆", "✖", "head request's need"):
            assert word in text
        await pilot.press("j")  # scrolls the help; does not leave it
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert app.screen is app.screen_stack[0]


async def test_truncated_trace_opens_and_says_where_it_ends(tmp_path):
    torn = tmp_path / "torn.trace"
    generate(torn, 300, seed=5, cut_bytes=2001)  # as a killed recorder leaves it: no footer, torn record
    cut_at = torn.stat().st_size
    reader = TraceReader(torn)
    assert not reader.closed_cleanly
    app = TraceApp(reader)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert 0 < app.passes < 300
        assert "truncated at byte" in app.status_text
        assert reader.truncated_at is not None and reader.truncated_at <= cut_at
        await pilot.press("end")
        assert app.selected == app.passes - 1
        assert f"Pass {app.passes - 1}" in detail_text(app)


async def test_clearing_a_filter_that_matched_nothing_brings_the_cursor_back_on_screen(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        pass_list = app.query_one(PassList)
        await pilot.press("g", *"777", "enter")
        await pilot.press("f", *"fix no-such-fix", "enter")
        await settle(app, pilot)
        assert pass_list.row_count == 0
        await pilot.press("f", "enter")  # empty clears
        await settle(app, pilot)
        assert pass_list.row_count == PASSES
        assert app.selected == pass_list.selected_pass == 777
        top = int(pass_list.scroll_y)
        assert top <= pass_list.cursor < top + pass_list.scrollable_content_region.height
        assert "Pass 777" in detail_text(app)


def state_rows(text: str) -> dict[str, str]:
    """The detail pane's "Recorded state" table as {label: value}."""
    rows = {}
    for line in text.split("Recorded state", 1)[1].splitlines()[1:]:
        if " │ " not in line:
            break
        label, value = line.split(" │ ", 1)
        rows[label.strip()] = value.strip()
    return rows


async def test_detail_shows_each_hybrid_pool_only_where_it_was_recorded(tmp_path):
    from schedtrace.testing.builders import header, pass_record
    from schedtrace.tracer.contract.format import TraceWriter
    from schedtrace.tracer.contract.schema import KvSnapshot

    path = tmp_path / "hybrid.trace"
    writer = TraceWriter(path, header())
    writer.write(pass_record(0, kv=KvSnapshot(available=900, evictable=40)))  # a plain model
    writer.write(pass_record(1, kv=KvSnapshot(available=800, evictable=30, swa_available=5120, swa_evictable=256,
                                              mamba_available=48, mamba_evictable=3)))
    writer.write(pass_record(2, kv=KvSnapshot(available=700, evictable=20, swa_available=4096)))
    writer.close(3_000_000)
    app = TraceApp(TraceReader(path))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        rows = state_rows(detail_text(app))
        assert rows["kv free / evictable"] == "900 / 40"
        assert not [label for label in rows if label.startswith(("swa", "mamba"))]
        await pilot.press("down")
        rows = state_rows(detail_text(app))
        assert rows["kv free / evictable"] == "800 / 30"
        assert rows["swa free / evictable"] == "5120 / 256"
        assert rows["mamba free / evictable"] == "48 / 3"
        await pilot.press("down")
        rows = state_rows(detail_text(app))
        assert rows["swa free"] == "4096"  # no evictable count recorded: no "/ None"
        assert not [label for label in rows if label.startswith("mamba") or "evictable" in label and "swa" in label]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from schedtrace.cli import main; main()", "tui", *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize(
    "content, expected",
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"\x93\xa4pass\x01\x02", "expected a header record first"),
        (b"\xc1\xc1\xc1\xc1", "offset 0"),
    ],
    ids=["missing", "empty", "no-header", "garbage"],
)
def test_bad_trace_is_one_line_on_stderr(tmp_path, content, expected):
    path = tmp_path / "bad.trace"
    if content is not None:
        path.write_bytes(content)
    result = run_cli(str(path))
    assert result.returncode == 2
    assert expected in result.stderr and str(path) in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_report_and_bad_options_are_one_line(trace, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = run_cli(str(trace[0]), "--report", str(bad))
    assert result.returncode == 2 and "not a schedtrace replay report" in result.stderr
    result = run_cli(str(trace[0]), "--old", "stock")
    assert result.returncode == 2 and "--old and --new go together" in result.stderr
    result = run_cli(str(trace[0]), "--old", "stock", "--new", "nonsense")
    assert result.returncode == 2 and "unknown variant" in result.stderr
    assert "Traceback" not in result.stderr


async def test_old_new_runs_the_real_replay_in_a_worker_and_jumps_to_its_divergence(tmp_path):
    """``--old stock --new fixed``: the real sglang replay runs in a worker and
    its divergences arrive as messages; `n` then jumps to the latch divergence."""
    from repro_traces import latch_trace

    path = latch_trace(tmp_path / "latch.trace")
    app = TraceApp(TraceReader(path), arms=("stock", "fixed"))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.replay.report is not None and app.replay.report.fidelity.matched == 10
        assert sorted(app.replay.divergences) == list(range(10))
        await pilot.press("n")
        assert app.selected == app.detail_pass == 1  # the next divergence after pass 0
        text = detail_text(app)
        assert "fixes responsible: latch" in text and "≠ batch_is_full" in text
