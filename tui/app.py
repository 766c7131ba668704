"""The schedtrace browser: header, timeline, pass list and detail pane.

State goes down: the app's reactives are bound to its widgets (``data_bind``).
Messages come up (``messages.py``): from the widgets (the cursor moved, the
timeline was clicked) and from thread workers (``workers.py``: the trace
scan, filters, the request view, the replay). The UI thread only ever
decodes the handful of passes on screen.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from schedtrace.tracer.analysis.outcome import OUTCOMES
from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.report import Report
from schedtrace.tui import workers
from schedtrace.tui.messages import (
    CursorMoved,
    DivergenceFound,
    FilterReady,
    IndexReady,
    PassPicked,
    ReplayDone,
    ReplayProgress,
    ScanDone,
    ScanProgress,
    TimelineReady,
    TimelineResized,
    WorkerFailed,
)
from schedtrace.tui.model.filters import PassFilter
from schedtrace.tui.model.marks import Marks, build_marks
from schedtrace.tui.model.pass_cache import PassCache
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.rows import ListedPasses
from schedtrace.tui.model.scan import ScanResult
from schedtrace.tui.model.series import TimelineData, timeline_data
from schedtrace.tui.widgets.bars import Status, StatusLine, TraceHeader
from schedtrace.tui.widgets.detail import DetailPane
from schedtrace.tui.widgets.pass_detail import pass_detail
from schedtrace.tui.widgets.pass_list import HEADER_TEXT, PassList
from schedtrace.tui.widgets.screens import HelpScreen, Prompt, RequestScreen
from schedtrace.tui.widgets.timeline import Timeline

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


def _key_label(key: str) -> str:
    return key.replace("slash", "/").replace("question_mark", "?")


class TraceApp(App[None]):
    CSS_PATH = "styles.tcss"
    TITLE = "schedtrace"
    BINDINGS = [Binding(key, action, description, show=key in _SHOWN) for key, action, description in KEYS]

    # The state the widgets are bound to (see compose). ``var``, not ``reactive``: a change
    # repaints only the widgets bound to it, never the whole screen.
    passes: var[int] = var(0, init=False)  # passes known so far
    listed: var[ListedPasses] = var(ListedPasses(0), always_update=True, init=False)
    selected: var[int] = var(0, init=False)
    marks: var[Marks] = var(Marks, init=False)
    scan: var[ScanResult | None] = var(None, init=False)
    divergences: var[int] = var(0, init=False)
    status: var[Status] = var(Status(), init=False)
    scan_note: var[str] = var("scanning trace…", init=False)
    timeline: var[TimelineData | None] = var(None, init=False)
    detail: var[list[Text]] = var(lambda: [Text("No pass selected.")], always_update=True, init=False)

    def __init__(self, reader: TraceReader, *, report: Report | None = None,
                 arms: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.reader = reader
        self.trace_path = reader.path
        self.cache = PassCache(reader)
        self.replay = ReplayIndex(report)
        self.arms: tuple[str, str] | None = (report.old, report.new) if report is not None else arms
        self.run_arms = arms if report is None else None  # replay to run in a worker
        self.detail_pass: int | None = None  # the pass the detail pane shows
        self.flt: PassFilter | None = None
        self.rid: str | None = None
        self._timeline_buckets = 0
        self.set_reactive(TraceApp.passes, reader.pass_count if reader.closed_cleanly else 0)
        self.set_reactive(TraceApp.marks, build_marks(None, self.replay))
        self.set_reactive(TraceApp.divergences, len(self.replay.divergences))
        self.sub_title = Path(self.trace_path).name

    # --- layout ---

    def compose(self) -> ComposeResult:
        yield TraceHeader(self.reader, self.arms, id="trace-header").data_bind(
            TraceApp.passes, TraceApp.scan, TraceApp.divergences)
        yield StatusLine(id="status").data_bind(TraceApp.status)
        yield Timeline(id="timeline").data_bind(TraceApp.selected, data=TraceApp.timeline, note=TraceApp.scan_note)
        with Horizontal(id="main"):
            with Vertical(id="list-pane"):
                yield Static(HEADER_TEXT, id="list-header")
                yield PassList(self.cache, id="passes").data_bind(TraceApp.selected, TraceApp.listed, TraceApp.marks)
            yield DetailPane(id="detail").data_bind(lines=TraceApp.detail)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PassList).focus()
        if self.reader.closed_cleanly:
            self._show_passes()
        else:
            self.set_status("indexing an unclosed trace…")
            self.index_trace()
        # After the first frame: the scan thread competes with the UI thread for the GIL.
        self.call_after_refresh(self.scan_trace)
        if self.run_arms is not None:
            self.run_replay()

    @property
    def status_text(self) -> str:
        return self.status.text

    def set_status(self, text: str, *, error: bool = False) -> None:
        self.status = Status(text, error)

    # --- workers (bodies in workers.py) ---

    @work(thread=True, exclusive=True, group="index")
    def index_trace(self) -> None:
        workers.count_passes(self.reader, self.post_message)

    @work(thread=True, exclusive=True, group="scan")
    def scan_trace(self) -> None:
        worker = get_current_worker()
        workers.scan(self.trace_path, self.post_message, cancelled=lambda: worker.is_cancelled)

    @work(thread=True, exclusive=True, group="timeline")
    def build_timeline(self, scan: ScanResult, marks: Marks, buckets: int) -> None:
        if buckets > 0:
            self.post_message(TimelineReady(timeline_data(scan, marks, buckets)))

    @work(thread=True, exclusive=True, group="filter")
    def compute_filter(self, flt: PassFilter) -> None:
        workers.filter_passes(flt, self.passes, self.replay, self.scan.results if self.scan else None,
                              self.post_message)

    @work(thread=True, exclusive=True, group="request")
    def load_request(self, screen: RequestScreen, rid: str) -> None:
        workers.load_request(self.trace_path, rid, self.scan.rids.get(rid) if self.scan else None, self.passes,
                             self.reader.header.server_args.max_running_requests, screen.post_message)

    @work(thread=True, exclusive=True, group="replay")
    def run_replay(self) -> None:
        assert self.run_arms is not None
        workers.replay(self.trace_path, *self.run_arms, self.post_message)

    # --- worker messages ---

    def on_index_ready(self, message: IndexReady) -> None:
        self.passes = message.passes
        self._show_passes()
        if self.reader.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {self.reader.truncated_at:,}: "
                            f"showing the {self.passes:,} passes before it")
        else:
            self.set_status("")

    def on_scan_progress(self, message: ScanProgress) -> None:
        self.scan_note = f"scanning trace… {100 * message.done // max(message.total, 1)}%"

    def on_scan_done(self, message: ScanDone) -> None:
        scan = message.scan
        if not self.reader.closed_cleanly and self.passes == 0:
            self.passes = scan.passes
            self._show_passes()
        self.scan = scan
        self._rebuild_marks()
        if scan.failure:
            self.set_status(f"trace is corrupt: {scan.failure}; showing what came before", error=True)
        elif scan.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {scan.truncated_at:,} (killed recorder?): "
                            f"showing the {self.passes:,} valid passes; the last one is where it ends")

    def on_timeline_ready(self, message: TimelineReady) -> None:
        self.timeline = message.data

    def on_timeline_resized(self, message: TimelineResized) -> None:
        if message.buckets != self._timeline_buckets:
            self._timeline_buckets = message.buckets
            if self.scan is not None:
                self.build_timeline(self.scan, self.marks, message.buckets)

    def on_filter_ready(self, message: FilterReady) -> None:
        self.flt = message.flt
        self.listed = ListedPasses(self.passes, message.rows)
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
        self.marks.add_divergence(message.divergence.pass_)
        self.mutate_reactive(TraceApp.marks)
        self.divergences = len(self.replay.divergences)

    def on_replay_done(self, message: ReplayDone) -> None:
        self.replay = ReplayIndex(message.report)
        self._rebuild_marks()
        self.divergences = len(self.replay.divergences)
        self.set_status(f"replay done: {len(self.replay.divergences):,} divergences")
        self._show_detail()

    def on_worker_failed(self, message: WorkerFailed) -> None:
        self.set_status(f"{message.what} failed: {message.message}", error=True)
        if message.what == "filter":
            self.notify(message.message, severity="error")

    def _rebuild_marks(self) -> None:
        self.marks = build_marks(self.scan, self.replay)
        if self.scan is not None:
            self.build_timeline(self.scan, self.marks, self._timeline_buckets)

    # --- selection ---

    def _show_passes(self) -> None:
        self.listed = ListedPasses(self.passes)
        if self.passes == 0:
            self.detail = [Text("This trace has no pass records.", style="bold")]

    def on_cursor_moved(self, message: CursorMoved) -> None:
        if message.pass_no != self.selected:
            self.selected = message.pass_no
        elif self.detail_pass != message.pass_no:
            self._show_detail()

    def on_pass_picked(self, message: PassPicked) -> None:
        self.select_pass(message.pass_no)

    def select_pass(self, n: int) -> None:
        # The nearest listed pass, so that list, timeline and detail all move in this
        # same turn (one frame); the list's CursorMoved then finds nothing left to do.
        target = self.listed.nearest(n)
        if target is not None:
            self.selected = target

    def watch_selected(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        if not self.passes:
            return
        n = self.detail_pass = self.selected
        try:
            p = self.cache.get(n)
        except SchedtraceError as exc:
            self.detail = [Text(f"Pass {n} cannot be read: {exc}", style="bold red")]
            return
        self.detail = pass_detail(
            p,
            divergence=self.replay.divergences.get(n),
            mismatch=self.replay.mismatch_at(n),
            arms=self.arms,
            in_stall=self.marks.in_stall(n),
            failed_alloc=self.marks.failed_alloc_at(n),
        )

    # --- actions ---

    def action_jump(self, kind: str, direction: int) -> None:
        if kind == "divergence" and self.arms is None:
            self.notify("No replay loaded: open with --report or --old/--new.", severity="warning")
            return
        if kind != "divergence" and self.scan is None and not len(self.marks.of(kind)):
            self.notify(f"Still scanning the trace for {kind}s…", severity="warning")
            return
        target = (self.marks.next if direction > 0 else self.marks.previous)(kind, self.selected)
        if target is None:
            self.notify(f"No {'later' if direction > 0 else 'earlier'} {kind}.", severity="information")
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
                   hint=f"fixes: {fixes}; results: {' '.join(OUTCOMES)}"),
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
        self.push_screen(HelpScreen([(_key_label(key), description) for key, _, description in KEYS]))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, action, description in KEYS:
            yield SystemCommand(description, f"key {_key_label(key)}",
                                lambda action=action: self.run_action(action))
