"""Every message in the browser, in one place (as in toolong).

State goes down through reactives; these come back up. Workers (``workers.py``)
post the first group from their threads; widgets post the last group.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from textual.message import Message
from textual.worker import Worker

from schedtrace.tracer.contract.report import Divergence, Report
from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.desync import DesyncIndex
from schedtrace.tui.model.filters import PassFilter
from schedtrace.tui.model.lifecycle import LifeStep
from schedtrace.tui.model.charts import ChartData
from schedtrace.tui.model.scan import ScanResult
from schedtrace.tui.widgets.plots import ChartImage

# --- from workers, to the app ---------------------------------------------------------


@dataclass
class FromWorker(Message):
    """A thread worker's message, with the worker: the app drops it if the worker was cancelled
    before it landed (``TraceApp.on_from_worker``)."""

    worker: Worker
    message: Message


@dataclass
class IndexReady(Message):
    """An unclosed trace's passes are counted."""

    passes: int


@dataclass
class ScanProgress(Message):
    done: int  # bytes
    total: int


@dataclass
class ScanDone(Message):
    scan: ScanResult


@dataclass
class ChartsReady(Message):
    data: ChartData
    kv: ChartImage
    queue: ChartImage


@dataclass
class FilterReady(Message):
    flt: PassFilter | None  # None: the filter is cleared
    rows: array | None


@dataclass
class ReplayProgress(Message):
    done: int  # passes
    total: int


@dataclass
class DivergenceFound(Message):
    divergence: Divergence


@dataclass
class ReplayDone(Message):
    report: Report


@dataclass
class RanksCompared(Message):
    """Every rank of the run compared (``analysis.ranks``): where each disagrees."""

    desync: DesyncIndex


@dataclass
class GapsFound(Message):
    """The shown rank's unreadable regions (``rank``: which rank they are of, in the app's RankSet)."""

    rank: int
    gaps: list[GapView]


@dataclass
class WorkerFailed(Message):
    what: str  # "index", "scan", "filter", "replay", "charts", "ranks", "gaps"
    message: str


# --- from the request worker, to its RequestScreen ---------------------------------------


@dataclass
class RequestLoaded(Message):
    steps: list[LifeStep]
    note: str = ""  # e.g. that only the first passes of a long span were read


@dataclass
class RequestFailed(Message):
    message: str


# --- from widgets, to the app -------------------------------------------------------------


@dataclass
class CursorMoved(Message):
    """The pass list's cursor is on ``pass_no`` (a key, a click, or new rows)."""

    pass_no: int


@dataclass
class PassPicked(Message):
    """A chart asks for ``pass_no`` (a click, or left/right)."""

    pass_no: int


@dataclass
class ChartsResized(Message):
    width: int  # cells of one chart
    plot_height: int  # lines its plot may take
