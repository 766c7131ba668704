"""What the browser runs in thread workers: the I/O and the long computations.

Each function reads through its own ``TraceReader`` (a reader seeks its file,
and the UI thread keeps reading through the app's) and reports only by
posting messages (``schedtrace.tui.messages``); none touches a widget.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from textual.message import Message

from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tui.messages import (
    DivergenceFound,
    FilterReady,
    IndexReady,
    ReplayDone,
    ReplayProgress,
    RequestFailed,
    RequestLoaded,
    ScanDone,
    ScanProgress,
    WorkerFailed,
)
from schedtrace.tui.model.filters import PassFilter, apply_filter
from schedtrace.tui.model.lifecycle import find_rid_passes, request_life
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.rids import RidSpan
from schedtrace.tui.model.scan import scan_trace

Post = Callable[[Message], object]

SCAN_SWITCH_INTERVAL_S = 0.0005
MAX_REQUEST_PASSES = 200_000  # the request view reads at most this many passes of one rid's span


def count_passes(reader: TraceReader, post: Post) -> None:
    try:
        count = reader.pass_count  # one linear scan of an unclosed file
    except SchedtraceError as exc:
        post(WorkerFailed("index", str(exc)))
        return
    post(IndexReady(count))


def scan(path: str | Path, post: Post, cancelled: Callable[[], bool]) -> None:
    # While this thread decodes, the UI thread waits up to one switch interval for the
    # GIL each time it wakes; a shorter interval keeps keys answered during the scan.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, SCAN_SWITCH_INTERVAL_S))
    try:
        with TraceReader(path) as own:
            result = scan_trace(own, on_progress=lambda done, total: post(ScanProgress(done, total)),
                                cancelled=cancelled)
    except SchedtraceError as exc:
        post(WorkerFailed("scan", str(exc)))
        return
    finally:
        sys.setswitchinterval(switch_interval)
    post(ScanDone(result))


def filter_passes(flt: PassFilter, passes: int, replay: ReplayIndex, results: Sequence[int] | None,
                  post: Post) -> None:
    try:
        rows = apply_filter(flt, passes, replay, results)
    except ValueError as exc:
        post(WorkerFailed("filter", str(exc)))
        return
    post(FilterReady(flt, rows))


def load_request(path: str | Path, rid: str, span: RidSpan | None, passes: int, max_running: int | None,
                 post: Post) -> None:
    """``post`` goes to the RequestScreen showing ``rid``."""
    if span is None:
        post(RequestFailed(f"no request {rid!r} in this trace"))
        return
    last = min(span.last_pass, span.first_pass + MAX_REQUEST_PASSES - 1, passes - 1)
    note = "" if last == span.last_pass else f"(first {MAX_REQUEST_PASSES:,} passes of its span)"
    try:
        with TraceReader(path) as own:
            steps = request_life(rid, find_rid_passes(own, rid, span.first_pass, last), span, max_running)
    except SchedtraceError as exc:
        post(RequestFailed(str(exc)))
        return
    post(RequestLoaded(steps, note))


def replay(path: str | Path, old: str, new: str, post: Post) -> None:
    try:
        from schedtrace.replay.engine import replay_trace  # imports sglang: only when asked for
    except ImportError as exc:
        post(WorkerFailed("replay", f"replay engine not available: {exc}"))
        return
    try:
        report = replay_trace(
            path, old, new,
            on_progress=lambda done, total: post(ReplayProgress(done, total)),
            on_divergence=lambda d: post(DivergenceFound(d)),
        )
    except SchedtraceError as exc:
        post(WorkerFailed("replay", str(exc)))
        return
    except Exception as exc:  # a replay bug must not take the browser down with it
        post(WorkerFailed("replay", f"{type(exc).__name__}: {exc}"))
        return
    post(ReplayDone(report))
