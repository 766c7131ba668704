"""The browser's new views and keys, driven through Textual's Pilot: stall bands and centred jumps,
why nothing was admitted, requests by prefix, the conventions (j/k, focus, help), the header at 120
columns, a report of another trace, and quitting while the replay runs.

Traces: the recorded lpm sample (traces/) and the synthetic ones of test_tui.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.report import load_report
from schedtrace.testing.synthetic import generate
from schedtrace.tui.app import TraceApp
from schedtrace.tui.widgets.charts import Chart
from schedtrace.tui.widgets.detail import DetailPane
from schedtrace.tui.widgets.pass_list import PassList
from schedtrace.tui.widgets.screens import RequestScreen
from test_tui import SIZE, anyio_backend, detail_text, make_app, settle, trace  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio

LPM = Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace"


def line_at(pass_list: PassList, pass_no: int):
    """The rendered line of ``pass_no`` (on screen), as (text, set of background colours)."""
    y = pass_list.listed.row_of(pass_no) - int(pass_list.scroll_y)
    assert 0 <= y < pass_list.scrollable_content_region.height, f"pass {pass_no} is not on screen"
    pass_list._line_style = pass_list.rich_style
    strip = pass_list.render_line(y)
    return strip.text, {seg.style.bgcolor.name for seg in strip if seg.style and seg.style.bgcolor}


async def test_s_says_whose_stall_centres_it_and_bands_its_passes(trace):
    from schedtrace.tui.widgets import palette

    app = make_app(trace)
    first = min(load_report(trace[1]).stalls["stock"], key=lambda s: s.start_pass)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("s")
        assert app.selected == first.start_pass
        assert app.status_text.startswith(f"stall of stock: passes {first.start_pass}–{first.end_pass}")
        assert "fixed: no stall here" in app.status_text
        pass_list = app.query_one(PassList)
        height = pass_list.scrollable_content_region.height
        assert pass_list.cursor - int(pass_list.scroll_y) == height // 2  # centred, not on the last line
        band = palette.ARM_COLOURS[0].band.lstrip("#").lower()
        inside, colours = line_at(pass_list, first.start_pass + 1)
        assert inside[2] == palette.STALL_BAR and any(band in c.lower() for c in colours)
        before, colours = line_at(pass_list, first.start_pass - 1)
        assert before[2] == " " and not any(band in c.lower() for c in colours)
        # The charts band the same passes: the KV chart's canvas cell at the stall's column.
        chart = app.query_one("#kv-chart", Chart)
        image, data = chart.image, chart.data
        column = data.axis.column_of(first.start_pass + 1)
        row = chart._built_line(image.top, image, data)
        cell = row.crop(image.left + 1 + column, image.left + 2 + column)
        assert any(seg.style.bgcolor and band in seg.style.bgcolor.name.lower() for seg in cell)
        await pilot.press("n")  # n centres too
        assert pass_list.cursor - int(pass_list.scroll_y) == height // 2


async def test_why_nothing_was_admitted_in_the_detail_and_the_wide_list():
    app = TraceApp(TraceReader(LPM), stall_passes=1)
    latch = "latched since 866; 4 slots free; head needs 2415, budget 2421 → the latch fix admits"
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(app, pilot)
        await pilot.press("s")
        assert app.selected == 867 and app.status_text.startswith("stall of recorded: passes 867–867 (1 pass)")
        assert f"why: {latch}" in " ".join(detail_text(app).split())
        text, _ = line_at(app.query_one(PassList), 867)
        assert latch[:40] in text
        text, _ = line_at(app.query_one(PassList), 868)
        assert "latched since 866, and budget 2414 ≤ head 2415" in text


async def test_a_divergent_pass_has_each_arms_why(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("n")
        text = detail_text(app)
        assert "why (stock): " in text and "why (fixed): " in text


async def test_find_request_by_unique_prefix_and_highlight_it():
    from schedtrace.tui.widgets import palette

    app = TraceApp(TraceReader(LPM))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        rid = app.scan.rids.matching("daeaf")[0]
        await pilot.press("g", *"867", "enter", "slash", *"daeaf", "enter")
        await pilot.pause()
        assert app.rid == rid and app.selected == app.scan.rids[rid].first_pass
        assert rid in app.status_text  # the full id; lists show the short one
        await pilot.press("g", *"867", "enter")
        row = next(t for t in app.detail if "daeaf5eb" in t.plain and "│" in t.plain)
        assert rid not in row.plain and any(span.style == palette.SEARCHED for span in row.spans)
        await pilot.press("slash", *"zzz", "enter")
        await pilot.pause()
        assert any("No request id starts with 'zzz'" in str(n.message) for n in app._notifications)
        assert app.rid == rid


async def test_an_ambiguous_prefix_lists_some_of_its_requests(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("slash", *"r00001", "enter")
        await pilot.pause()
        assert app.rid is None
        assert any("starts several request ids (r0000100, r0000101" in str(n.message) for n in app._notifications)


async def test_rid_and_stall_filters():
    app = TraceApp(TraceReader(LPM), stall_passes=1)
    with TraceReader(LPM) as reader:
        mentions = [n for n, p in enumerate(reader.passes()) if any(w.rid.startswith("daeaf") for w in p.waiting)
                    or any(a.rid.startswith("daeaf") for a in p.admitted)
                    or any(r.rid.startswith("daeaf") for r in p.running)]
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        pass_list = app.query_one(PassList)
        await pilot.press("f", *"rid daeaf", "enter")
        await settle(app, pilot)
        assert [pass_list.pass_of(i) for i in range(pass_list.row_count)] == mentions
        assert app.status_text.startswith("filter: rid=daeaf5eb")
        await pilot.press("f", *"stall", "enter")
        await settle(app, pilot)
        assert pass_list.row_count == 1 and pass_list.pass_of(0) == 867


async def test_j_k_tab_and_the_request_view_has_the_keys_when_it_opens(trace):
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("j", "j", "k")
        assert app.selected == 1
        list_pane, detail = app.query_one("#list-pane"), app.query_one(DetailPane)
        focused_colour = list_pane.styles.border_left[1]
        await pilot.press("tab")
        assert app.focused is detail
        assert detail.styles.border_left[1] == focused_colour != list_pane.styles.border_left[1]
        await pilot.press("shift+tab")
        await pilot.press("slash", *"r0000100", "enter", "r")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, RequestScreen)
        table = screen.query_one(DataTable)
        assert app.focused is table
        await pilot.press("j", "j")
        assert table.cursor_row == 2
        await pilot.press("k")
        assert table.cursor_row == 1


async def test_the_header_fits_120_columns(trace):
    app = make_app(trace)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        header = app.query_one("#trace-header")
        text = header.text()
        assert text.cell_len <= header.content_region.width
        assert "passes 1,200" in text.plain and "divergences" in text.plain


async def test_a_report_of_another_trace_is_flagged(trace, tmp_path):
    other, other_report = tmp_path / "other.trace", tmp_path / "other.json"
    generate(other, 500, seed=8, report_path=other_report)
    app = TraceApp(TraceReader(trace[0]), report=load_report(other_report))
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.report_doubts and "other.trace, not t.trace" in app.status_text
        assert app.status.error and "REPORT not of this trace?" in app.query_one("#trace-header").text().plain
    app = make_app(trace)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert app.report_doubts == [] and "REPORT" not in app.query_one("#trace-header").text().plain


async def test_q_ends_the_replay_at_once(tmp_path):
    """The replay runs in a child process; q kills it (and its group) instead of waiting for it."""
    import signal

    from repro_traces import latch_trace

    app = TraceApp(TraceReader(latch_trace(tmp_path / "latch.trace")), arms=("stock", "fixed"))
    async with app.run_test(size=SIZE) as pilot:
        while app.replay_process.process is None:
            await pilot.pause(0.01)
        child = app.replay_process.process
        assert child.poll() is None  # importing sglang: the replay has not begun
        await pilot.press("q")
    assert child.wait(timeout=10) == -signal.SIGKILL
    assert app.replay_process.ended.wait(timeout=10)  # its thread is done too: nothing holds the exit
