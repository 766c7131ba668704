"""The schedtrace browser: header, charts, pass list and detail pane.

State goes down: the app's reactives are bound to its widgets (``data_bind``).
Messages come up (``messages.py``): from the widgets (the cursor moved, a
chart was clicked) and from thread workers (``workers.py``: the trace scan,
the charts, filters, the request view, the replay, the report check). The UI
thread only ever decodes the handful of passes on screen. The prompts'
actions (``g``, ``/``, ``f``) are in ``prompts.py``; the ranks (``[`` ``]``),
their comparison and the gaps and losses in ``rank_actions.py``.
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
from textual.widgets import Footer
from textual.worker import get_current_worker

from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.errors import SchedtraceError, TraceDamagedError
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.report import Report
from schedtrace.tracer.contract.traceset import source_paths
from schedtrace.tui import workers
from schedtrace.tui.keys import KEYS, PANES, SHOWN
from schedtrace.tui.messages import (
    ChartsReady,
    ChartsResized,
    CursorMoved,
    DivergenceFound,
    FilterReady,
    FromWorker,
    IndexReady,
    PassPicked,
    ReplayDone,
    ReplayProgress,
    ScanDone,
    ScanProgress,
    WorkerFailed,
)
from schedtrace.tui.model.charts import ChartData
from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.desync import DesyncIndex
from schedtrace.tui.model.filters import FilterInputs, PassFilter
from schedtrace.tui.model.marks import RECORDED, Marks, build_marks
from schedtrace.tui.model.rank_set import RankSet, Reader
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.report_match import report_doubts
from schedtrace.tui.model.rows import ListedPasses
from schedtrace.tui.model.scan import ScanResult
from schedtrace.tui.prompts import PromptActions
from schedtrace.tui.rank_actions import RankActions
from schedtrace.tui.replay_process import ReplayProcess
from schedtrace.tui.widgets.bars import Status, StatusLine, TraceHeader
from schedtrace.tui.widgets.charts import Chart
from schedtrace.tui.widgets.detail import DetailPane
from schedtrace.tui.widgets.help import HelpScreen, key_label, keys_text, legend_text, pane_keys
from schedtrace.tui.widgets.pass_detail import pass_detail
from schedtrace.tui.widgets.pass_list import ListHeader, PassList
from schedtrace.tui.widgets.plots import ChartImage
from schedtrace.tui.widgets.screens import RequestScreen



class TraceApp(PromptActions, RankActions, App[None]):
    CSS_PATH = "styles.tcss"
    TITLE = "schedtrace"
    BINDINGS = [Binding(key, action, description, show=key in SHOWN) for key, action, description in KEYS
                if key != "tab"]

    # The state the widgets are bound to (see compose). ``var``, not ``reactive``: a change
    # repaints only the widgets bound to it, never the whole screen.
    passes: var[int] = var(0, init=False)  # passes known so far
    listed: var[ListedPasses] = var(ListedPasses(0), always_update=True, init=False)
    selected: var[int] = var(0, init=False)
    marks: var[Marks] = var(Marks, init=False)
    scan: var[ScanResult | None] = var(None, init=False)
    divergences: var[int] = var(0, init=False)
    status: var[Status] = var(Status(), init=False)
    chart_note: var[str] = var("scanning trace…", init=False)
    chart_data: var[ChartData | None] = var(None, init=False)
    kv_image: var[ChartImage | None] = var(None, init=False)
    queue_image: var[ChartImage | None] = var(None, init=False)
    report_doubts: var[list[str]] = var(list, init=False)
    detail: var[list[Text]] = var(lambda: [Text("No pass selected.")], always_update=True, init=False)
    gaps: var[list[GapView]] = var(list, init=False)  # the shown rank's
    ranks_verdict: var[tuple[str, bool] | None] = var(None, init=False)  # the header's: what, and a desync?

    def __init__(self, reader: Reader, *, report: Report | None = None,
                 arms: tuple[str, str] | None = None, stall_passes: int = DEFAULT_STALL_PASSES,
                 ranks: RankSet | None = None, rank: int = 0) -> None:
        """``stall_passes``: the stall rule's threshold for the trace's own stalls (a report has its own).
        ``ranks``: the run's ranks, ``reader`` reading the ``rank``-th (the replay's, if any)."""
        super().__init__()
        self.stall_passes = stall_passes
        self.rank_set, self.rank_index, self.home_rank = ranks, rank, rank
        self.first_reader = reader  # the caller's: closed by the caller
        self.desync: DesyncIndex | None = None
        self.attach(reader)
        self.replay = self.home_replay = ReplayIndex(report)
        self.arms: tuple[str, str] | None = (report.old, report.new) if report is not None else arms
        self.home_arms = self.arms
        self.replay_process = ReplayProcess(source_paths(reader), *arms) if report is None and arms else None
        self.detail_pass: int | None = None  # the pass the detail pane shows
        self.flt: PassFilter | None = None
        self.rid: str | None = None  # the request found with /
        self._chart_size = (0, 0)
        self.set_reactive(TraceApp.passes, reader.pass_count if reader.closed_cleanly else 0)
        self.set_reactive(TraceApp.marks, build_marks(None, self.replay))
        self.set_reactive(TraceApp.divergences, len(self.replay.divergences))
        self.sub_title = self.rank_position or Path(self.trace_path).name

    # --- layout ---

    def compose(self) -> ComposeResult:
        yield TraceHeader(self.reader, self.arms, self.rank_position, id="trace-header").data_bind(
            TraceApp.passes, TraceApp.scan, TraceApp.divergences, TraceApp.report_doubts, TraceApp.gaps,
            ranks=TraceApp.ranks_verdict)
        yield StatusLine(id="status").data_bind(TraceApp.status)
        with Horizontal(id="charts"):
            for kind, image in (("kv", TraceApp.kv_image), ("queue", TraceApp.queue_image)):
                yield Chart(kind, id=f"{kind}-chart").data_bind(
                    TraceApp.selected, data=TraceApp.chart_data, image=image, note=TraceApp.chart_note)
        with Horizontal(id="main"):
            with Vertical(id="list-pane"):
                yield ListHeader(id="list-header")
                yield PassList(self.cache, self.why, id="passes").data_bind(
                    TraceApp.selected, TraceApp.listed, TraceApp.marks)
            yield DetailPane(id="detail").data_bind(lines=TraceApp.detail)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PassList).focus()
        self.start_rank()
        if self.rank_set is not None and len(self.rank_set) > 1:
            self.ranks_verdict = ("comparing…", False)
            self.set_status(f"{len(self.rank_set)} ranks: [ and ] switch, d jumps to where they disagree")
            self.call_after_refresh(self.compare_ranks)
        if self.replay_process is not None:
            self.run_replay()

    @property
    def status_text(self) -> str:
        return self.status.text

    def set_status(self, text: str, *, error: bool = False) -> None:
        self.status = Status(text, error)

    # --- workers (bodies in workers.py) ---

    def worker_post(self) -> workers.Post:
        """How the current thread worker posts to the app: through ``on_from_worker``. A thread
        worker runs to its end though a newer one of its group (or a rank switch) cancelled it,
        so its result could land over the newer one's."""
        worker = get_current_worker()
        return lambda message: self.post_message(FromWorker(worker, message))

    def on_from_worker(self, message: FromWorker) -> None:
        # On the UI thread, in arrival order: a result of a worker cancelled by now is
        # stale, and one of a worker not cancelled lands before any that replaces it.
        if not message.worker.is_cancelled:
            self.post_message(message.message)

    @work(thread=True, exclusive=True, group="index")
    def index_trace(self) -> None:
        workers.count_passes(self.reader, self.worker_post())

    @work(thread=True, exclusive=True, group="scan")
    def scan_trace(self) -> None:
        worker = get_current_worker()
        workers.scan(self.shared, self.worker_post(), cancelled=lambda: worker.is_cancelled,
                     stall_passes=self.stall_passes)

    @work(thread=True, exclusive=True, group="gaps")
    def find_gaps(self) -> None:
        workers.find_gaps(self.shared, self.rank_index, self.worker_post())

    @work(thread=True, exclusive=True, group="ranks")
    def compare_ranks(self) -> None:
        assert self.rank_set is not None
        worker = get_current_worker()
        workers.compare(self.rank_set, self.worker_post(), lambda: worker.is_cancelled)

    @work(thread=True, exclusive=True, group="charts")
    def build_charts(self, scan: ScanResult, marks: Marks, width: int, plot_height: int) -> None:
        workers.build_charts(self.shared, scan, marks, width, plot_height, self.worker_post())

    @work(thread=True, exclusive=True, group="filter")
    def compute_filter(self, flt: PassFilter) -> None:
        worker = get_current_worker()
        rids = self.scan.rids if self.scan else None
        inputs = FilterInputs(
            self.passes, self.replay, self.marks, self.scan.results if self.scan else None,
            rid_passes=lambda rid: workers.rid_pass_numbers(self.shared, rid, rids.get(rid) if rids else None,
                                                            lambda: worker.is_cancelled),
        )
        workers.filter_passes(flt, inputs, self.worker_post())

    @work(thread=True, exclusive=True, group="request")
    def load_request(self, screen: RequestScreen, rid: str) -> None:
        worker = get_current_worker()
        workers.load_request(self.shared, rid, self.scan.rids.get(rid) if self.scan else None, self.passes,
                             capacity.max_running(self.reader.header), screen.post_message,
                             lambda: worker.is_cancelled)

    @work(thread=True, exclusive=True, group="replay")
    def run_replay(self) -> None:
        assert self.replay_process is not None
        self.replay_process.run(self.post_message)

    # --- worker messages ---

    def on_index_ready(self, message: IndexReady) -> None:
        self.passes = message.passes
        self._show_passes()
        if self.rank_index == self.home_rank:
            self.check_report()
        if self.reader.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {self.reader.truncated_at:,}: "
                            f"showing the {self.passes:,} passes before it")
        else:
            self.set_status("")

    def on_scan_progress(self, message: ScanProgress) -> None:
        self.chart_note = f"scanning trace… {100 * message.done // max(message.total, 1)}%"

    def on_scan_done(self, message: ScanDone) -> None:
        scan = message.scan
        if not self.reader.closed_cleanly and self.passes == 0:
            self.passes = scan.passes
            self._show_passes()
        self.scan = scan
        self.why.set_latch(scan.latch)
        self._rebuild_marks()
        self._show_detail()
        if scan.failure:
            self.set_status(f"trace is corrupt: {scan.failure}; showing what came before", error=True)
        elif scan.truncated_at is not None:
            self.set_status(f"trace is truncated at byte {scan.truncated_at:,} (killed recorder?): "
                            f"showing the {self.passes:,} valid passes; the last one is where it ends")
        if not scan.passes:
            self.chart_note = "no passes to chart"

    def on_charts_ready(self, message: ChartsReady) -> None:
        self.chart_data, self.kv_image, self.queue_image = message.data, message.kv, message.queue

    def on_charts_resized(self, message: ChartsResized) -> None:
        size = (message.width, message.plot_height)
        if size != self._chart_size:
            self._chart_size = size
            self._rebuild_charts()

    def _rebuild_charts(self) -> None:
        width, height = self._chart_size
        if self.scan is not None and self.scan.passes and width > 20:
            self.build_charts(self.scan, self.marks, width, height)

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
        self.home_replay.add(message.divergence)
        if self.rank_index != self.home_rank:
            return  # the replay is of the first rank shown
        self.marks.add_divergence(message.divergence.pass_)
        self.mutate_reactive(TraceApp.marks)
        self.divergences = len(self.replay.divergences)

    def on_replay_done(self, message: ReplayDone) -> None:
        self.home_replay = ReplayIndex(message.report)
        if self.rank_index != self.home_rank:
            self.set_status(f"replay of rank {self.rank_set.ranks[self.home_rank].label} done")
            return
        self.replay = self.home_replay
        self._rebuild_marks()
        self.divergences = len(self.replay.divergences)
        self.set_status(f"replay done: {len(self.replay.divergences):,} divergences")
        self._show_detail()

    def check_report(self) -> None:
        """Say when the report shown is not this trace's (about a millisecond: the passes are counted)."""
        if self.replay.report is None:
            return
        try:
            doubts = report_doubts(self.replay.report, self.reader)
        except SchedtraceError as exc:
            doubts = [f"it could not be checked against the trace: {exc}"]
        self.report_doubts = doubts
        if doubts:
            self.set_status("this report may not be this trace's: " + "; ".join(doubts), error=True)

    def on_worker_failed(self, message: WorkerFailed) -> None:
        self.set_status(f"{message.what} failed: {message.message}", error=True)
        if message.what == "filter":
            self.notify(message.message, severity="error")

    def _rebuild_marks(self) -> None:
        desync = self.desync.of(self.rank_label) if self.desync is not None else ()
        self.marks = build_marks(self.scan, self.replay, desync=desync, gaps=[gap.position for gap in self.gaps])
        self._rebuild_charts()

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
        # The nearest listed pass, so that list, charts and detail all move in this
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
        except TraceDamagedError as exc:
            self.detail = self.lost_detail(n, exc)
            return
        except SchedtraceError as exc:
            self.detail = [Text(f"Pass {n} cannot be read: {exc}", style="bold red")]
            return
        divergence = self.replay.divergences.get(n)
        if divergence is not None and self.arms is not None:
            why = self.why.by_arm(n, p, divergence, self.arms)
        else:
            why = [(None, self.why.of(n, p))]
        self.detail = pass_detail(
            p,
            divergence=divergence,
            mismatch=self.replay.mismatch_at(n),
            arms=self.arms,
            stalls=self.marks.stalls_at(n),
            arm_order=self.marks.arms,
            failed_alloc=self.marks.failed_alloc_at(n),
            why=why,
            searched=self.rid,
            events=self.rank_events(n, p),
        )

    # --- actions ---

    def action_jump(self, kind: str, direction: int) -> None:
        refused = self.jump_refused(kind)
        if refused is not None:
            self.notify(refused, severity="warning")
            return
        target = (self.marks.next if direction > 0 else self.marks.previous)(kind, self.selected)
        if target is None:
            what = "gap or loss" if kind == "damage" else kind
            self.notify(f"No {'later' if direction > 0 else 'earlier'} {what}.", severity="information")
            return
        self.select_pass(target)
        if kind == "stall":
            self.set_status(self.marks.stall_status(target))
        elif kind in ("desync", "damage"):
            self.set_status(self.jump_status(kind, target))

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
        self.push_screen(HelpScreen(keys_text(self.help_keys()), legend_text(self.marks.arms or (RECORDED,))))

    def help_keys(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """Every key: the app's, then each pane's."""
        everywhere = [(key_label(key), description) for key, _, description in KEYS]
        return [("everywhere", everywhere), *((where, pane_keys(widget)) for where, widget in PANES)]

    async def action_quit(self) -> None:
        if self.replay_process is not None:
            self.replay_process.stop()  # the replay's thread then ends with its child: nothing waits for it
        self.exit()

    def on_unmount(self) -> None:
        if self.replay_process is not None:
            self.replay_process.stop()
        self.shared.close()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, action, description in KEYS:
            yield SystemCommand(description, f"key {key_label(key)}",
                                lambda action=action: self.run_action(action))
