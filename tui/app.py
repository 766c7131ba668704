"""The schedtrace browser: header, timeline, pass list and detail pane.

I/O happens in thread workers (the trace scan, filters, the request view,
the replay) which report back with dataclass messages; the UI thread only
ever decodes the handful of passes on screen.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static

from schedtrace.tracer.contract.report import Divergence, Report
from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tui.model import (
    SERIES,
    Marks,
    PassCache,
    PassFilter,
    ReplayIndex,
    ScanResult,
    apply_filter,
    build_marks,
    downsample,
    find_rid_passes,
    header_lines,
    mark_buckets,
    request_life,
    scan_trace,
)
from schedtrace.tui.widgets.detail import DetailPane, pass_detail
from schedtrace.tui.widgets.pass_list import HEADER_TEXT, PassList
from schedtrace.tui.widgets.screens import HelpScreen, Prompt, RequestScreen
from schedtrace.tui.widgets.timeline import Timeline, TimelineData

SCAN_SWITCH_INTERVAL_S = 0.0005
MAX_REQUEST_PASSES = 200_000  # the request view reads at most this many passes of one rid's span


# --- messages from workers ------------------------------------------------------------


@dataclass
class IndexReady(Message):
    passes: int


@dataclass
class ScanProgress(Message):
    done: int
    total: int


@dataclass
class ScanDone(Message):
    scan: ScanResult


@dataclass
class TimelineReady(Message):
    data: TimelineData


@dataclass
class FilterReady(Message):
    flt: PassFilter | None
    rows: array | None


@dataclass
class ReplayProgress(Message):
    done: int
    total: int


@dataclass
class DivergenceFound(Message):
    divergence: Divergence


@dataclass
class ReplayDone(Message):
    report: Report


@dataclass
class WorkerFailed(Message):
    what: str
    message: str


KEYS: list[tuple[str, str, str]] = [
    # (key, action, description) — the footer, `?` help and the command palette all list these
    ("n", "jump('divergence', 1)", "Next divergence"),
    ("N", "jump('divergence', -1)", "Previous divergence"),
    ("s", "jump('stall', 1)", "Next stall"),
    ("S", "jump('stall', -1)", "Previous stall"),
    ("e", "jump('error', 1)", "Next error"),
    ("E", "jump('error', -1)", "Previous error"),
    ("g", "goto", "Go to pass"),
    ("slash", "find_rid", "Find rid"),
    ("f", "filter", "Filter passes"),
    ("r", "request", "Request view"),
    ("question_mark", "help", "Help"),
    ("q", "quit", "Quit"),
]
_SHOWN = {"n", "s", "e", "g", "slash", "f", "r", "question_mark", "q"}


class TraceApp(App[None]):
    CSS_PATH = "styles.tcss"
    TITLE = "schedtrace"
    BINDINGS = [Binding(key, action, description, show=key in _SHOWN) for key, action, description in KEYS]

    def __init__(self, reader: TraceReader, *, report: Report | None = None,
                 arms: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.reader = reader
        self.trace_path = reader.path
        self.cache = PassCache(reader)
        self.replay = ReplayIndex(report)
        self.arms: tuple[str, str] | None = (report.old, report.new) if report is not None else arms
        self.run_arms = arms if report is None else None  # replay to run in a worker
        self.scan: ScanResult | None = None
        self.marks: Marks = build_marks(None, self.replay)
        self._error_set: set[int] = set(self.marks.error)
        self._failed_allocs: set[int] = set()
        self.passes = reader.pass_count if reader.closed_cleanly else 0
        self.selected = 0
        self.detail_pass: int | None = None  # the pass the detail pane shows
        self.flt: PassFilter | None = None
        self.rid: str | None = None
        self._timeline_buckets = 0
        self.status_text = ""
        self.sub_title = Path(self.trace_path).name

    # --- layout ---

    def compose(self) -> ComposeResult:
        yield Static(id="trace-header")
        yield Static(id="status")
        yield Timeline(id="timeline")
        with Horizontal(id="main"):
            with Vertical(id="list-pane"):
                yield Static(HEADER_TEXT, id="list-header")
                yield PassList(self.cache, marker=self._marker, id="passes")
            yield DetailPane(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self._render_header()
        pass_list = self.query_one(PassList)
        pass_list.focus()
        if self.reader.closed_cleanly:
            self._show_passes()
        else:
            self.set_status("indexing an unclosed trace…")
            self.index_trace()
        # After the first frame: the scan thread competes with the UI thread for the GIL.
        self.call_after_refresh(self.scan_trace)
        if self.run_arms is not None:
            self.run_replay()

    # --- header and status ---

    def _render_header(self) -> None:
        scan = self.scan
        pairs = header_lines(
            self.reader.header,
            pass_count=self.passes,
            duration_ns=scan.end_ns if scan else None,
            losses=scan.losses if scan else 0,
            truncated_at=(scan.truncated_at if scan else None) or self.reader.truncated_at,
            closed_cleanly=self.reader.closed_cleanly,
        )
        text = Text()
        for label, value in pairs:
            style = "bold red" if label in ("TRUNCATED", "unclosed") or (label == "lost" and value != "0") else ""
            text.append(f"{label} ", style="dim")
            text.append(value, style=style or "bold")
            text.append("  ")
        if self.arms is not None:
            text.append("replay ", style="dim")
            text.append(f"{self.arms[0]} → {self.arms[1]}", style="bold")
            text.append(f"  {len(self.replay.divergences):,} divergences", style="bold magenta")
        self.query_one("#trace-header", Static).update(text)

    def set_status(self, text: str, *, error: bool = False) -> None:
        self.status_text = text
        self.query_one("#status", Static).update(Text(text, style="bold red" if error else "italic"))

    # --- workers ---

    @work(thread=True, exclusive=True, group="index")
    def index_trace(self) -> None:
        try:
            count = self.reader.pass_count  # one linear scan of an unclosed file
        except SchedtraceError as exc:
            self.post_message(WorkerFailed("index", str(exc)))
            return
        self.post_message(IndexReady(count))

    @work(thread=True, exclusive=True, group="scan")
    def scan_trace(self) -> None:
        worker = self._current_worker()
        # While this thread decodes, the UI thread waits up to one switch interval for the
        # GIL each time it wakes; a shorter interval keeps keys answered during the scan.
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SCAN_SWITCH_INTERVAL_S))
        try:
            with TraceReader(self.trace_path) as own:  # its own file position: the UI keeps reading
                result = scan_trace(
                    own,
                    on_progress=lambda done, total: self.post_message(ScanProgress(done, total)),
                    cancelled=lambda: worker is not None and worker.is_cancelled,
                )
        except SchedtraceError as exc:
            self.post_message(WorkerFailed("scan", str(exc)))
            return
        finally:
            sys.setswitchinterval(switch_interval)
        self.post_message(ScanDone(result))

    @staticmethod
    def _current_worker():
        from textual.worker import get_current_worker

        try:
            return get_current_worker()
        except Exception:
            return None

    @work(thread=True, exclusive=True, group="timeline")
    def build_timeline(self, buckets: int) -> None:
        scan = self.scan
        if scan is None or buckets <= 0:
            return
        passes = scan.passes
        series = {name: downsample(scan.series[name], 0, passes, buckets) for name in SERIES}
        used = len(series[SERIES[0]])
        data = TimelineData(
            passes=passes,
            buckets=used,
            series=series,
            peaks={name: max(values, default=0) for name, values in series.items()},
            marks=mark_buckets(self.marks, passes, used),
        )
        self.post_message(TimelineReady(data))

    @work(thread=True, exclusive=True, group="filter")
    def compute_filter(self, flt: PassFilter) -> None:
        try:
            rows = apply_filter(flt, self.passes, self.replay, self.scan.results if self.scan else None)
        except ValueError as exc:
            self.post_message(WorkerFailed("filter", str(exc)))
            return
        self.post_message(FilterReady(flt, rows))

    @work(thread=True, exclusive=True, group="request")
    def load_request(self, screen: RequestScreen, rid: str) -> None:
        span = self.scan.rids.get(rid) if self.scan else None
        if span is None:
            self.call_from_thread(screen.show_failure, f"no request {rid!r} in this trace")
            return
        last = min(span.last_pass, span.first_pass + MAX_REQUEST_PASSES - 1, self.passes - 1)
        note = "" if last == span.last_pass else f"(first {MAX_REQUEST_PASSES:,} passes of its span)"
        try:
            with TraceReader(self.trace_path) as own:
                passes = find_rid_passes(own, rid, span.first_pass, last)
                steps = request_life(rid, passes, span, self.reader.header.server_args.max_running_requests)
        except SchedtraceError as exc:
            self.call_from_thread(screen.show_failure, str(exc))
            return
        self.call_from_thread(screen.show_steps, steps, note)

    @work(thread=True, exclusive=True, group="replay")
    def run_replay(self) -> None:
        assert self.run_arms is not None
        old, new = self.run_arms
        try:
            from schedtrace.replay.engine import replay_trace
        except ImportError as exc:
            self.post_message(WorkerFailed("replay", f"replay engine not available: {exc}"))
            return
        try:
            report = replay_trace(
                self.trace_path, old, new,
                on_progress=lambda done, total: self.post_message(ReplayProgress(done, total)),
                on_divergence=lambda d: self.post_message(DivergenceFound(d)),
            )
        except SchedtraceError as exc:
            self.post_message(WorkerFailed("replay", str(exc)))
            return
        except Exception as exc:  # a replay bug must not take the browser down with it
            self.post_message(WorkerFailed("replay", f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ReplayDone(report))

    # --- worker messages ---

    def on_index_ready(self, message: IndexReady) -> None:
        self.passes = message.passes
        self._show_passes()
        self._render_header()
        if self.reader.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {self.reader.truncated_at:,}: "
                            f"showing the {self.passes:,} passes before it")
        else:
            self.set_status("")

    def on_scan_progress(self, message: ScanProgress) -> None:
        self.query_one(Timeline).set_status(f"scanning trace… {100 * message.done // max(message.total, 1)}%")

    def on_scan_done(self, message: ScanDone) -> None:
        scan = self.scan = message.scan
        if not self.reader.closed_cleanly and self.passes == 0:
            self.passes = scan.passes
            self._show_passes()
        self._rebuild_marks()
        self._render_header()
        if scan.failure:
            self.set_status(f"trace is corrupt: {scan.failure}; showing what came before", error=True)
        elif scan.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {scan.truncated_at:,} (killed recorder?): "
                            f"showing the {self.passes:,} valid passes; the last one is where it ends")

    def on_timeline_ready(self, message: TimelineReady) -> None:
        timeline = self.query_one(Timeline)
        timeline.set_data(message.data)
        timeline.select(self.selected)

    def on_timeline_resized(self, message: Timeline.Resized) -> None:
        if self.scan is not None and message.buckets != self._timeline_buckets:
            self._timeline_buckets = message.buckets
            self.build_timeline(message.buckets)

    def on_filter_ready(self, message: FilterReady) -> None:
        self.flt = message.flt
        pass_list = self.query_one(PassList)
        pass_list.set_rows(self.passes, message.rows, keep_pass=self.selected)
        label = f"filter: {message.flt.describe()} ({len(message.rows or ()):,} passes)" if message.flt else ""
        self.set_status(label)
        if message.flt is not None and not message.rows:
            self.notify("No pass matches this filter.", severity="warning")

    def on_replay_progress(self, message: ReplayProgress) -> None:
        self.set_status(f"replaying {self.arms[0]} → {self.arms[1]}… "
                        f"{message.done:,}/{message.total:,} passes, "
                        f"{len(self.replay.divergences):,} divergences so far")

    def on_divergence_found(self, message: DivergenceFound) -> None:
        self.replay.add(message.divergence)
        self.marks.divergence = array("q", sorted(self.replay.divergences))
        self.query_one(PassList).refresh()
        self._render_header()

    def on_replay_done(self, message: ReplayDone) -> None:
        self.replay = ReplayIndex(message.report)
        self._rebuild_marks()
        self._render_header()
        self.set_status(f"replay done: {len(self.replay.divergences):,} divergences")
        self._show_detail()

    def on_worker_failed(self, message: WorkerFailed) -> None:
        self.set_status(f"{message.what} failed: {message.message}", error=True)
        if message.what == "filter":
            self.notify(message.message, severity="error")

    def _rebuild_marks(self) -> None:
        self.marks = build_marks(self.scan, self.replay)
        self._error_set = set(self.marks.error)
        self._failed_allocs = set(self.scan.failed_allocs) if self.scan else set()
        self.query_one(PassList).refresh()
        if self.scan is not None:
            self.build_timeline(self.query_one(Timeline).buckets)

    # --- selection ---

    def _show_passes(self) -> None:
        pass_list = self.query_one(PassList)
        pass_list.set_rows(self.passes, None, keep_pass=self.selected)
        if self.passes == 0:
            self.query_one(DetailPane).show(Text("This trace has no pass records.", style="bold"))

    def _marker(self, n: int) -> tuple[str, Style]:
        if n in self._error_set:
            return "✖", Style(color="red", bold=True)
        if n in self.replay.divergences:
            return "◆", Style(color="bright_magenta", bold=True)
        if self.marks.stall_ranges and self.marks.in_stall(n):
            return "▬", Style(color="yellow")
        return " ", Style()

    def on_pass_list_selected(self, message: PassList.Selected) -> None:
        if message.pass_no != self.selected or self.detail_pass != message.pass_no:
            self._apply_selection(message.pass_no)

    def _apply_selection(self, n: int) -> None:
        self.selected = n
        self.query_one(Timeline).select(n)
        self._show_detail()

    def on_timeline_selected(self, message: Timeline.Selected) -> None:
        self.select_pass(message.pass_no)

    def select_pass(self, n: int) -> None:
        pass_list = self.query_one(PassList)
        pass_list.select_pass(n)
        # Update timeline and detail now, in this same turn, so one frame shows the whole
        # move; the list's Selected message then finds nothing left to do.
        target = pass_list.selected_pass
        if target is not None:
            self._apply_selection(target)

    def _show_detail(self) -> None:
        if not self.passes:
            return
        n = self.detail_pass = self.selected
        try:
            p = self.cache.get(n)
        except SchedtraceError as exc:
            self.query_one(DetailPane).show(Text(f"Pass {n} cannot be read: {exc}", style="bold red"))
            return
        failed_alloc = n in self._failed_allocs
        self.query_one(DetailPane).show(
            pass_detail(
                p,
                divergence=self.replay.divergences.get(n),
                mismatch=self.replay.mismatch_at(n),
                arms=self.arms,
                in_stall=bool(self.marks.stall_ranges) and self.marks.in_stall(n),
                failed_alloc=failed_alloc,
            )
        )

    # --- actions ---

    def action_jump(self, kind: str, direction: int) -> None:
        label = {"divergence": "divergence", "stall": "stall", "error": "error"}[kind]
        if kind == "divergence" and self.arms is None:
            self.notify("No replay loaded: open with --report or --old/--new.", severity="warning")
            return
        if kind != "divergence" and self.scan is None and not len(self.marks.of(kind)):
            self.notify(f"Still scanning the trace for {label}s…", severity="warning")
            return
        target = (self.marks.next if direction > 0 else self.marks.previous)(kind, self.selected)
        if target is None:
            self.notify(f"No {'later' if direction > 0 else 'earlier'} {label}.", severity="information")
            return
        self.select_pass(target)

    def action_goto(self) -> None:
        def done(text: str | None) -> None:
            if not text:
                return
            try:
                n = int(text.strip().replace(",", "").replace("_", ""))
            except ValueError:
                self.notify(f"Not a pass number: {text!r}", severity="error")
                return
            if not 0 <= n < self.passes:
                self.notify(f"Pass {n} is out of range (0–{self.passes - 1}).", severity="error")
                return
            self.select_pass(n)

        self.push_screen(Prompt("Go to pass:", placeholder=f"0–{max(self.passes - 1, 0)}"), done)

    def action_find_rid(self) -> None:
        def done(text: str | None) -> None:
            rid = (text or "").strip()
            if not rid:
                return
            if self.scan is None:
                self.notify("Still building the request index; try again in a moment.", severity="warning")
                return
            span = self.scan.rids.get(rid)
            if span is None:
                self.notify(f"No request {rid!r} in this trace.", severity="error")
                return
            self.rid = rid
            self.select_pass(span.first_pass)
            self.set_status(f"request {rid}: passes {span.first_pass}–{span.last_pass}; press r for its life")

        self.push_screen(Prompt("Find request id:", placeholder="rid"), done)

    def action_filter(self) -> None:
        fixes = ", ".join(sorted(self.replay.fixes)) or "none"

        def done(text: str | None) -> None:
            if text is None:
                return
            if not text.strip():
                self.post_message(FilterReady(None, None))
                return
            try:
                flt = PassFilter.parse(text)
            except ValueError as exc:
                self.notify(str(exc), severity="error")
                return
            if flt.kind in ("divergent", "fix") and self.arms is None:
                self.notify("No replay loaded: only result filters work.", severity="warning")
                return
            self.compute_filter(flt)

        self.push_screen(
            Prompt("Filter passes (empty clears):", placeholder="divergent | fix NAME | result WORD | !…",
                   hint=f"fixes: {fixes}; results: none admit chunk full no-token error"),
            done,
        )

    def action_request(self) -> None:
        rid = self.rid or self._rid_at_selection()
        if rid is None:
            self.notify("No request here: use / to find one.", severity="warning")
            return
        if self.scan is None:
            self.notify("Still building the request index; try again in a moment.", severity="warning")
            return
        screen = RequestScreen(rid)

        def done(pass_no: int | None) -> None:
            if pass_no is not None:
                self.select_pass(pass_no)

        self.push_screen(screen, done)
        self.load_request(screen, rid)

    def _rid_at_selection(self) -> str | None:
        if not self.passes:
            return None
        p = self.cache.get(self.selected)
        for rows in (p.admitted, p.candidates, p.waiting):
            if rows:
                return rows[0].rid
        return p.chunked.rid if p.chunked else None

    def action_help(self) -> None:
        self.push_screen(HelpScreen([(key.replace("slash", "/").replace("question_mark", "?"), description)
                                     for key, _, description in KEYS]))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, action, description in KEYS:
            shown = key.replace("slash", "/").replace("question_mark", "?")
            yield SystemCommand(description, f"key {shown}",
                                lambda action=action: self.run_action(action))
