"""What the browser runs in thread workers: the I/O and the long computations.

Each function reads through the workers' ``SharedReader`` (the UI thread
keeps reading through the app's own) and reports only by posting messages
(``schedtrace.tui.messages``); none touches a widget. The replay runs in a
child process (``replay_process.py``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from textual.message import Message

from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.analysis.ranks import compare_ranks
from schedtrace.tui.messages import (
    ChartsReady,
    FilterReady,
    GapsFound,
    IndexReady,
    RanksCompared,
    RequestFailed,
    RequestLoaded,
    ScanDone,
    ScanProgress,
    WorkerFailed,
)
from schedtrace.tui.model.charts import chart_data
from schedtrace.tui.model.damage import reader_gaps
from schedtrace.tui.model.desync import DesyncIndex
from schedtrace.tui.model.filters import FilterInputs, PassFilter, apply_filter
from schedtrace.tui.model.lifecycle import find_rid_passes, request_life
from schedtrace.tui.model.marks import Marks
from schedtrace.tui.model.rank_set import RankSet, Reader, StoppableRank, reopen
from schedtrace.tui.model.rids import RidSpan
from schedtrace.tui.model.scan import ScanResult, scan_trace

Post = Callable[[Message], object]

SCAN_SWITCH_INTERVAL_S = 0.0005
MAX_REQUEST_PASSES = 200_000  # the request view reads at most this many passes of one rid's span


def count_passes(reader: Reader, post: Post) -> None:
    try:
        count = reader.pass_count  # one linear scan of an unclosed file
    except SchedtraceError as exc:
        post(WorkerFailed("index", str(exc)))
        return
    post(IndexReady(count))


class SharedReader:
    """The one ``TraceReader`` the thread workers read through, one worker at a time.

    A reader is not for two threads at once (it rebuilds delta passes from a
    cache), and each new one costs: it checks the whole file (a hash of all
    its bytes) and holds its own pass index. So the workers share this one
    (the UI thread keeps reading through the app's own).
    """

    def __init__(self, like: Reader) -> None:
        self.like = like  # the UI thread's reader: this one reads the same trace (every part, past gaps alike)
        self._lock = threading.Lock()
        self._reader: Reader | None = None

    @contextmanager
    def use(self) -> Iterator[Reader]:
        with self._lock:
            if self._reader is None:
                self._reader = reopen(self.like)
            yield self._reader

    def close(self) -> None:
        if self._lock.acquire(timeout=1.0):  # a worker still reading is cancelled, and ends within a moment
            try:
                if self._reader is not None:
                    self._reader.close()
                    self._reader = None
            finally:
                self._lock.release()


def scan(shared: SharedReader, post: Post, cancelled: Callable[[], bool], stall_passes: int) -> None:
    # While this thread decodes, the UI thread waits up to one switch interval for the
    # GIL each time it wakes; a shorter interval keeps keys answered during the scan.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, SCAN_SWITCH_INTERVAL_S))
    try:
        with shared.use() as own:
            result = scan_trace(own, on_progress=lambda done, total: post(ScanProgress(done, total)),
                                cancelled=cancelled, stall_passes=stall_passes)
    except SchedtraceError as exc:
        post(WorkerFailed("scan", str(exc)))
        return
    finally:
        sys.setswitchinterval(switch_interval)
    post(ScanDone(result))


def filter_passes(flt: PassFilter, inputs: FilterInputs, post: Post) -> None:
    try:
        rows = apply_filter(flt, inputs)
    except (ValueError, SchedtraceError) as exc:
        post(WorkerFailed("filter", str(exc)))
        return
    post(FilterReady(flt, rows))


def rid_pass_numbers(shared: SharedReader, rid: str, span: RidSpan | None,
                     cancelled: Callable[[], bool]) -> list[int]:
    """Pass numbers that mention ``rid`` (the rid filter's rows): only its span is read."""
    if span is None:
        return []
    with shared.use() as own:
        return [n for n, _ in find_rid_passes(own, rid, span.first_pass, span.last_pass, cancelled)]


def load_request(shared: SharedReader, rid: str, span: RidSpan | None, passes: int, max_running: int | None,
                 post: Post, cancelled: Callable[[], bool]) -> None:
    """``post`` goes to the RequestScreen showing ``rid``."""
    if span is None:
        post(RequestFailed(f"no request {rid!r} in this trace"))
        return
    last = min(span.last_pass, span.first_pass + MAX_REQUEST_PASSES - 1, passes - 1)
    note = "" if last == span.last_pass else f"(first {MAX_REQUEST_PASSES:,} passes of its span)"
    try:
        with shared.use() as own:
            steps = request_life(rid, find_rid_passes(own, rid, span.first_pass, last, cancelled), span,
                                 max_running)
    except SchedtraceError as exc:
        post(RequestFailed(str(exc)))
        return
    post(RequestLoaded(steps, note))


def build_charts(shared: SharedReader, scan: ScanResult, marks: Marks, width: int, plot_height: int,
                 post: Post) -> None:
    from schedtrace.tui.widgets.plots import canvas_columns, kv_image, queue_image  # imports plotext

    try:
        with shared.use() as own:
            data = chart_data(scan, marks, own.header, canvas_columns(width), own.pass_at)
    except SchedtraceError as exc:
        post(WorkerFailed("charts", str(exc)))
        return
    if data is not None:
        post(ChartsReady(data, kv_image(data, width, plot_height), queue_image(data, width, plot_height)))


def compare(ranks: RankSet, post: Post, cancelled: Callable[[], bool]) -> None:
    """Compare every rank of the run, as ``schedtrace ranks`` does, through readers of its own."""
    traces = [StoppableRank(r, cancelled) for r in ranks.ranks]
    index = DesyncIndex({r.label: r.header.first_pass for r in traces})
    try:
        report = compare_ranks(traces, run=ranks.run, on_point=index.add)
    except SchedtraceError as exc:
        post(WorkerFailed("ranks", str(exc)))
        return
    finally:
        for trace in traces:
            trace.close()
    if cancelled():
        return  # the comparison stopped part-way: nothing to show
    post(RanksCompared(index.finish(report, {r.label: r.header.start_wall_ns for r in ranks.ranks})))


def find_gaps(shared: SharedReader, rank: int, post: Post) -> None:
    try:
        with shared.use() as own:
            gaps = reader_gaps(own)
    except SchedtraceError as exc:
        post(WorkerFailed("gaps", str(exc)))
        return
    post(GapsFound(rank, gaps))
