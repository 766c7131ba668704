"""The two charts drawn by plotext (through textual-plotext's ``Plot``), as lines of text.

plotext takes tens of milliseconds per chart, so charts are built in a
thread worker, once per scan and per size, never on a cursor move: the
``Chart`` widget draws the cursor and the stall bands over the built lines.
The x axis is the column number (one per ``TimeAxis`` slice) labelled in
seconds, so a column's cells are exactly ``ChartImage.left + 1 + column``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rich.text import Text

from schedtrace.tui.model.charts import ChartData, count_label
from schedtrace.tui.widgets import palette

Y_LABEL_WIDTH: Final = 5  # every y tick label is padded to this: the canvas starts at a known column
FRAME: Final = 2  # the canvas's left and right frame lines


def canvas_columns(width: int) -> int:
    """Data columns a chart ``width`` cells wide draws."""
    return width - Y_LABEL_WIDTH - FRAME


@dataclass(frozen=True, eq=False)  # compared by identity (a reactive holds it)
class ChartImage:
    lines: list[Text]
    left: int  # the cell of the canvas's left frame: column c is drawn at left + 1 + c
    top: int  # the first canvas line
    rows: int  # canvas lines
    columns: int


def _plot(width: int, height: int, data: ChartData, top: float):
    from textual_plotext.plot import Plot  # plotext is imported by the worker, never before the first paint

    plot = Plot()
    plot.plotsize(width, height)
    plot._set_size(width, height)  # textual-plotext's own widget does both (its issue 5)
    plot.theme("clear")
    columns = data.axis.columns
    plot.xlim(0, columns - 1)
    plot.ylim(0, top)
    plot.xticks(*data.axis.ticks())
    ticks = [0, top // 2 if top >= 10 else top / 2, top]
    plot.yticks(ticks, [count_label(t).rjust(Y_LABEL_WIDTH)[-Y_LABEL_WIDTH:] for t in ticks])
    return plot


def _image(plot, columns: int) -> ChartImage:
    lines = Text.from_ansi(plot.build()).split("\n")
    lines = [line for line in lines if line.plain.strip()]  # plotext ends with an empty line
    plain = [line.plain for line in lines]
    top_line = next(i for i, text in enumerate(plain) if "┌" in text)
    bottom_line = next(i for i, text in enumerate(plain) if "└" in text)
    left = plain[top_line].index("┌")
    return ChartImage(lines, left, top_line + 1, bottom_line - top_line - 1, columns)


def _segments(values: list[float | None]) -> list[tuple[list[int], list[float]]]:
    """Runs of known values as (columns, values): a line is not drawn across unknown columns."""
    runs: list[tuple[list[int], list[float]]] = []
    for c, v in enumerate(values):
        if v is None:
            continue
        if runs and runs[-1][0][-1] == c - 1:
            runs[-1][0].append(c)
            runs[-1][1].append(v)
        else:
            runs.append(([c], [v]))
    return runs


def kv_image(data: ChartData, width: int, height: int) -> ChartImage:
    """The KV pool stacked from the bottom: free, evictable, used (to max_total_tokens); the head's need as a line."""
    plot = _plot(width, height, data, data.total)
    x = list(range(data.axis.columns))
    free_top = data.free
    evict_top = [f + e for f, e in zip(data.free, data.evictable)]
    used_top = [min(top + u, data.total) for top, u in zip(evict_top, data.used)]
    # Drawn top band first: each later fill covers the one below it.
    for values, colour in ((used_top, palette.KV_USED), (evict_top, palette.KV_EVICTABLE),
                           (free_top, palette.KV_FREE)):
        plot.plot(x, values, fillx=True, marker="hd", color=colour)
    for cols, needs in _segments(data.need):
        plot.plot(cols, [min(v, data.total) for v in needs], marker="braille", color=palette.HEAD_NEED)
    return _image(plot, data.axis.columns)


def queue_image(data: ChartData, width: int, height: int) -> ChartImage:
    """Requests waiting and running, the running limit as a flat line."""
    top = max(max(data.waiting, default=0), max(data.running, default=0), data.max_running or 0, 1)
    plot = _plot(width, height, data, top)
    x = list(range(data.axis.columns))
    if data.max_running:
        plot.hline(data.max_running, color=palette.CAPACITY)
    plot.plot(x, data.running, marker="braille", color=palette.RUNNING)
    plot.plot(x, data.waiting, marker="braille", color=palette.QUEUE)
    return _image(plot, data.axis.columns)
