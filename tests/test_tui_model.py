"""The browser's pure view model (schedtrace.tui.model): no app, no terminal.

Real inputs: the recorded lpm sample (traces/) and synthetic traces with
planted stalls (schedtrace.testing.synthetic).
"""

from __future__ import annotations

from array import array
from pathlib import Path

import msgspec
import pytest

from schedtrace.tracer.analysis.stalls import recorded_stalls
from schedtrace.tracer.analysis.why import why, why_trace
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.report import Decision, load_report
from schedtrace.testing.synthetic import generate
from schedtrace.tui.model.charts import TimeAxis, chart_data, head_need_line
from schedtrace.tui.model.diff import decision_diff
from schedtrace.tui.model.filters import FilterInputs, PassFilter, apply_filter
from schedtrace.tui.model.header import fit, header_items
from schedtrace.tui.model.lifecycle import request_life
from schedtrace.tui.model.marks import RECORDED, Marks, build_marks
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.report_match import report_doubts
from schedtrace.tui.model.rids import RidIndex, RidSpan
from schedtrace.tui.model.scan import scan_trace
from schedtrace.tui.model.why_lines import WhyLines

LPM = Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace"


@pytest.fixture(scope="module")
def lpm() -> tuple[TraceReader, list]:
    reader = TraceReader(LPM)
    return reader, list(reader.passes())


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("model")
    path, report = directory / "s.trace", directory / "s.json"
    generate(path, 900, seed=4, report_path=report)
    return path, report


def test_scan_stalls_follow_the_rule_on_the_trace_header(lpm):
    reader, passes = lpm
    # README: with --stall-passes 1 the recording stalls at 867 only (the latch holds one pass).
    assert scan_trace(reader, stall_passes=1).stalls == [(867, 867)]
    expected = [(s.start_pass, s.end_pass) for s in recorded_stalls(passes, DEFAULT_STALL_PASSES, reader.header)]
    assert scan_trace(reader).stalls == expected


def test_latch_runs_give_why_trace_its_since_on_every_pass(lpm):
    reader, passes = lpm
    lines = WhyLines(reader.header)
    lines.set_latch(scan_trace(reader).latch)
    expected = [w.text for w in why_trace(passes, reader.header)]
    assert [lines.of(n, p).text for n, p in enumerate(passes)] == expected
    assert lines.of(867, passes[867]).text == (
        "latched since 866; 4 slots free; head needs 2415, budget 2421 → the latch fix admits")


def test_time_axis_slices_time_not_pass_numbers():
    # Passes 0-3 span 30 s of idling, then 100 passes come in one second.
    t_ns = array("q", [int(t * 1e9) for t in (4.7, 4.9, 31.7, 34.0)] + [int((34 + i / 100) * 1e9) for i in range(1, 101)])
    axis = TimeAxis.of(t_ns, 60)
    assert axis.t0 == pytest.approx(4.7) and axis.t1 == pytest.approx(35.0)
    assert axis.column_of(0) == 0 and axis.column_of(len(t_ns) - 1) == 59
    assert 50 <= axis.column_of(2) < axis.column_of(3) < axis.column_of(50)  # by time, not by index
    assert axis.pass_at(axis.column_of(2)) == 2
    assert axis.pass_at(25) == 1  # nothing recorded between 4.9 s and 31.7 s: the pass before holds
    cols, labels = axis.ticks()
    assert labels and all(label.endswith("s") for label in labels) and cols == sorted(cols)


def test_chart_columns_stack_to_the_pool_and_the_need_line_says_whether_the_head_fits(lpm):
    reader, passes = lpm
    scan = scan_trace(reader, stall_passes=1)
    data = chart_data(scan, build_marks(scan, ReplayIndex()), reader.header, 80, reader.pass_at)
    assert data.total == reader.header.server_args.max_total_tokens == 24000
    assert len(data.free) == len(data.need) == len(data.waiting) == len(data.stalled) == 80
    assert all(f + e + u == data.total for f, e, u in zip(data.free, data.evictable, data.used))
    assert max(data.waiting) == max(scan.series["waiting"]) and data.running == [
        max(scan.series["running"][slice(*data.axis.slice_of(c))] or [scan.series["running"][data.kv_pass[c]]])
        for c in range(80)]
    assert data.stalled[data.axis.column_of(867)] == (True,) and sum(map(any, data.stalled)) == 1
    # 867: the check admits the head (the latch held it) -> its line is under the free + evictable top;
    # 868: back-pressure -> above it.
    for n, fits in ((867, True), (868, False)):
        p = passes[n]
        assert (head_need_line(p, reader.header) < p.kv.available + p.kv.evictable) is fits
        assert why(p, reader.header).check.admits is fits


def test_marks_keep_each_arms_stalls_apart(synthetic):
    report = load_report(synthetic[1])
    with TraceReader(synthetic[0]) as reader:
        scan = scan_trace(reader)
    marks = build_marks(scan, ReplayIndex(report))
    assert marks.arms == ("stock", "fixed")
    first = report.stalls["stock"][0]
    assert marks.stalled_arms(first.start_pass) == (True, False)
    assert marks.stalled_arms(first.start_pass - 1) == (False, False)
    assert [r.describe() for r in marks.stalls_at(first.end_pass)] == [
        f"stall of stock: passes {first.start_pass}–{first.end_pass} ({first.passes} passes)"]
    alone = build_marks(scan, ReplayIndex())
    assert alone.arms == (RECORDED,) and [(r.start, r.end) for r in alone.stall_runs()] == scan.stalls


def test_stall_and_rid_filters(synthetic):
    report = load_report(synthetic[1])
    with TraceReader(synthetic[0]) as reader:
        scan = scan_trace(reader)
    replay = ReplayIndex(report)
    marks = build_marks(scan, replay)
    inputs = FilterInputs(scan.passes, replay, marks, scan.results, rid_passes=lambda rid: [3, 5, 8])
    stalled = [n for s in report.stalls["stock"] for n in range(s.start_pass, s.end_pass + 1)]
    assert list(apply_filter(PassFilter.parse("stall"), inputs)) == stalled
    assert list(apply_filter(PassFilter.parse("stall stock"), inputs)) == stalled
    assert list(apply_filter(PassFilter.parse("stall fixed"), inputs)) == []
    assert len(apply_filter(PassFilter.parse("!stall"), inputs)) == scan.passes - len(stalled)
    assert list(apply_filter(PassFilter.parse("rid r0000012"), inputs)) == [3, 5, 8]
    with pytest.raises(ValueError, match="no arm 'nope'"):
        apply_filter(PassFilter.parse("stall nope"), inputs)
    assert PassFilter.parse("rid r00").describe() == "rid=r00"


def test_rids_are_found_by_unique_prefix():
    rids = RidIndex()
    for n, rid in enumerate(["daeaf5eb3d71", "daeb0000", "4ae2aea7", "daeaf5eb"]):
        rids.touch(rid, n)
    rids.freeze()
    assert rids.matching("daeaf5eb3") == ["daeaf5eb3d71"]
    assert rids.matching("daeaf5eb") == ["daeaf5eb"]  # an exact id is itself, though it prefixes another
    assert rids.matching("dae") == ["daeaf5eb", "daeaf5eb3d71", "daeb0000"]
    assert rids.matching("zz") == []


def test_header_fits_120_columns_leaving_out_the_least_useful_first(lpm):
    reader, _ = lpm
    items = header_items(reader.header, pass_count=1474, duration_ns=109_720_000_000, losses=0, truncated_at=None,
                         closed_cleanly=True)
    wide = fit(items, 200)
    assert wide == items
    narrow = fit(items, 80)
    text = "  ".join(f"{i.label} {i.value}".strip() for i in narrow)
    assert len(text) <= 80
    assert {"max run", "kv", "passes"} <= {i.label for i in narrow}
    assert "lost" not in {i.label for i in narrow}  # nothing lost: the first to go


def test_header_shows_what_the_server_could_hold_where_the_flag_was_unset():
    """The Kimi sample's server ran without --max-running-requests: sglang capped the running
    requests at its 8 state-pool slots. An earlier recorder kept the flag as given (None);
    the header says 8 either way, the request pool's size."""
    with TraceReader(LPM.parent / "hybrid-mamba-kimi.trace") as reader:
        recorded = reader.header
    header = msgspec.structs.replace(
        recorded, server_args=msgspec.structs.replace(recorded.server_args, max_running_requests=None))
    assert recorded.server_args.max_running_requests == header.max_req_slots == 8
    items = {i.label: i.value for i in header_items(header, pass_count=1, duration_ns=1, losses=0,
                                                    truncated_at=None, closed_cleanly=True)}
    assert (items["max run"], items["kv"]) == ("8", str(header.pools.full_size))


def test_report_doubts_name_what_does_not_fit(synthetic, tmp_path):
    report = load_report(synthetic[1])
    with TraceReader(synthetic[0]) as reader:
        assert report_doubts(report, reader) == []
    other, other_report = tmp_path / "other.trace", tmp_path / "other.json"
    generate(other, 1500, seed=9, report_path=other_report)
    with TraceReader(synthetic[0]) as reader:
        doubts = report_doubts(load_report(other_report), reader)
        # The trace's own fingerprint: its report, though the file was renamed since.
        renamed = msgspec.structs.replace(report, trace="renamed.trace", trace_fingerprint=reader.fingerprint())
        assert report_doubts(renamed, reader) == []
        stale = msgspec.structs.replace(renamed, trace_fingerprint="blake2b:00")
        assert any("fingerprints differ" in d for d in report_doubts(stale, reader))
    assert any("1500" in d and "900" in d for d in doubts)
    assert any("other.trace, not s.trace" in d for d in doubts)


def test_decision_diff_marks_only_changed_fields_and_shortens_rids():
    old = Decision(admitted=[("daeaf5eb3d714493876b87c45e2b242d", 10)], batch_is_full=True)
    new = Decision(admitted=[("daeaf5eb3d714493876b87c45e2b242d", 10), ("b", 5)], batch_is_full=False)
    diffs = {d.name: d for d in decision_diff(old, new)}
    assert {name for name, d in diffs.items() if d.differs} == {"admitted", "batch_is_full"}
    assert diffs["admitted"].old == "daeaf5eb+10"


def test_request_life_folds_waiting_runs_and_names_reasons(synthetic):
    with TraceReader(synthetic[0]) as reader:
        passes = list(reader.passes(0, 400))
    rid = next(p.admitted[0].rid for p in passes[50:] if p.admitted)
    steps = request_life(rid, enumerate(passes), RidSpan(0, 399), max_running=12)
    waiting = [s for s in steps if s.state == "waiting"]
    assert waiting and all(s.detail.startswith(("not ", "tried", "pass raised")) for s in waiting)
    for a, b in zip(steps, steps[1:]):
        assert (a.state, a.detail) != (b.state, b.detail) or a.last + 1 != b.first
    assert any(s.state == "admitted" for s in steps)


def test_rid_index_keeps_spans_arrivals_and_finishes():
    rids = RidIndex()
    rids.arrived("a", 3, 1_500_000)
    rids.touch("a", 7)
    rids.touch("a", 5)  # an earlier pass does not shrink the span
    rids.touch("b", 9)
    rids.finished("a", 8, "length", 2_000_000_000)
    rids.finished("ghost", 8, "abort", 1)  # never seen: ignored
    assert rids["a"] == RidSpan(3, 8, 1_500_000, "length @ 2.00s")
    assert rids.get("b") == RidSpan(9, 9, None, None)
    assert "ghost" not in rids and rids.get("ghost") is None and len(rids) == 2
    with pytest.raises(KeyError):
        rids["ghost"]


def test_marks_jump_over_every_arms_onsets():
    marks = Marks()
    marks.set_stalls({"stock": [(10, 19), (50, 59)], "fixed": [(30, 31)]})
    assert list(marks.stall) == [10, 30, 50]
    assert marks.next("stall", 10) == 30 and marks.previous("stall", 30) == 10
    assert marks.stalled_arms(31) == (False, True) and marks.kind_at(31) == "stall"
