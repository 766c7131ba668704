"""The charts over the trace's time: the KV pool, and the queue against the running batch.

Each chart is a title line with the values at the selected pass, the plotext
lines a worker built (``plots.py``), and one line of events. Over the built
lines it draws, cheaply on every cursor move, the selected pass's column (in
reverse) and each arm's stalls as a band of the arm's colour (the upper rows
for the first arm, the lower for the second).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click, Resize
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from schedtrace.tui.messages import ChartsResized, PassPicked
from schedtrace.tui.model.charts import ChartData
from schedtrace.tui.model.marks import GLYPHS, POINT_KINDS
from schedtrace.tui.widgets import palette
from schedtrace.tui.widgets.plots import ChartImage

CURSOR = Style(reverse=True)
EVENT_STYLES = {GLYPHS[kind]: palette.MARK_STYLES[kind] for kind in POINT_KINDS}
TITLE_LINES = 1
EVENT_LINES = 1


def _swatch(text: Text, colour: tuple[int, int, int], label: str, glyph: str = "█") -> None:
    text.append(f" {glyph}", style=palette.rgb(colour))
    text.append(f" {label}", style="dim")


class Chart(Widget, can_focus=True):
    """One chart; the app binds ``data``, ``image``, ``selected`` and ``note``."""

    BINDINGS = [
        Binding("left,h", "step(-1)", "Earlier", show=False),
        Binding("right,l", "step(1)", "Later", show=False),
    ]
    DEFAULT_CSS = """
    Chart { width: 1fr; height: 100%; }
    Chart:focus { background: $boost; }
    """

    data: reactive[ChartData | None] = reactive(None, init=False)
    image: reactive[ChartImage | None] = reactive(None, init=False)
    selected: reactive[int] = reactive(0, init=False)
    note: reactive[str] = reactive("", init=False)

    def __init__(self, kind: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind = kind  # "kv" or "queue"
        self._lines: dict[int, Strip] = {}  # line -> the line as built (stall bands, no cursor), for _lines_for
        self._lines_for: tuple[object, object, int] = (None, None, -1)

    @property
    def plot_height(self) -> int:
        return max(self.size.height - TITLE_LINES - EVENT_LINES, 4)

    def on_resize(self, event: Resize) -> None:
        if self.kind == "kv":  # both charts are the same size: one message is enough
            self.post_message(ChartsResized(self.size.width, self.plot_height))

    # --- what the lines say ---

    def title(self) -> Text:
        """The chart's name and its values at the selected pass, in the words that fit the width."""
        full = self._title(long=True)
        return full if full.cell_len <= self.size.width else self._title(long=False)

    def _title(self, long: bool) -> Text:
        data, n = self.data, self.selected
        kv = self.kind == "kv"
        text = Text("KV tokens" if kv and long else "KV" if kv else "Requests", style="bold")
        if data is None:
            return text
        series = data.series
        n = max(min(n, len(series["kv_free"]) - 1), 0)
        text.append(f" at pass {n}:" if long else f" @{n}:", style="dim")
        if kv:
            free, evict = series["kv_free"][n], series["kv_evictable"][n]
            _swatch(text, palette.KV_USED, f"used {max(data.total - free - evict, 0)}")
            _swatch(text, palette.KV_EVICTABLE, f"{'evictable' if long else 'evict'} {evict}")
            _swatch(text, palette.KV_FREE, f"free {free}")
            _swatch(text, palette.HEAD_NEED, "head's need" if long else "need", "─")
        else:
            _swatch(text, palette.QUEUE, f"waiting {series['waiting'][n]}", "─")
            limit = f" of {data.max_running}" if data.max_running else ""
            _swatch(text, palette.RUNNING, f"running {series['running'][n]}{limit}", "─")
        return text

    def _events_line(self, image: ChartImage, data: ChartData) -> Strip:
        segments = [Segment("events".ljust(image.left + 1)[: image.left + 1], Style(dim=True))]
        for c, ch in enumerate(data.events):
            stalled = data.stalled[c] if c < len(data.stalled) else ()
            if ch != " ":
                band = next((palette.ARM_COLOURS[i].band for i, on in enumerate(stalled) if on), None)
                segments.append(Segment(ch, EVENT_STYLES[ch] + Style(bgcolor=band)))
            else:
                segments.append(_stall_cell(stalled))
        return Strip(segments)

    def _frame_line(self, strip: Strip, image: ChartImage, data: ChartData, arm: int) -> Strip:
        """The canvas's top (or bottom) frame, drawn in the arm's colour over its stalled columns:
        a chart whose canvas is all filled (the KV stack) still shows where the stalls are."""
        stalled = [c[arm] if arm < len(c) else False for c in data.stalled]
        if not any(stalled):
            return strip
        colour = palette.rgb(palette.ARM_COLOURS[arm].rgb) + Style(bold=True)
        left = image.left + 1
        pieces = strip.divide([*(left + c for c in range(len(stalled) + 1)), max(strip.cell_length, left + len(stalled))])
        return Strip.join([piece if not (0 < i <= len(stalled) and stalled[i - 1])
                           else Strip([Segment("━", colour)]) for i, piece in enumerate(pieces)])

    # --- drawing ---

    def _cached(self, y: int, image: ChartImage, data: ChartData, make) -> Strip:
        """Line ``y`` as ``make`` draws it, made once per image (the cursor is laid over it when shown)."""
        key = (image, data, self.size.width)
        if key != self._lines_for:
            self._lines_for, self._lines = key, {}
        strip = self._lines.get(y)
        if strip is None:
            strip = self._lines[y] = make()
        return strip

    def _built_line(self, y: int, image: ChartImage, data: ChartData) -> Strip:
        """Plot line ``y`` with the stall bands laid under it, cached per image."""
        return self._cached(y, image, data, lambda: self._banded_line(y, image, data))

    def _banded_line(self, y: int, image: ChartImage, data: ChartData) -> Strip:
        strip = Strip(image.lines[y].render(self.app.console))
        row = y - image.top
        arms = len(data.stalled[0]) if data.stalled else 0
        if 0 <= row < image.rows and arms:
            # Which arm's band this row shows: with two arms, the upper rows the first arm's.
            arm = 0 if arms == 1 or row < image.rows // 2 else 1
            strip = _tint(strip, image.left + 1, [c[arm] for c in data.stalled], palette.ARM_COLOURS[arm].band)
        elif arms and row in (-1, image.rows):
            strip = self._frame_line(strip, image, data, 0 if row == -1 or arms == 1 else 1)
        return strip

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y < TITLE_LINES:
            return Strip(self.title().render(self.app.console)).extend_cell_length(width).crop(0, width)
        image, data = self.image, self.data
        if image is None or data is None:
            text = self.note if y == self.size.height // 2 else ""
            return Strip([Segment(text[:width], Style(dim=True))]).extend_cell_length(width)
        line = y - TITLE_LINES
        cursor = data.axis.column_of(self.selected)
        if line < len(image.lines):
            strip = self._built_line(line, image, data)
            over = 0 <= line - image.top < image.rows
        elif line == len(image.lines):
            strip, over = self._cached(line, image, data, lambda: self._events_line(image, data)), True
        else:
            return Strip.blank(width)
        strip = strip.extend_cell_length(width)
        if over:
            x = image.left + 1 + cursor
            before, at, after = strip.divide([x, x + 1, width])
            strip = Strip.join([before, at.apply_style(CURSOR), after])
        return strip.crop(0, width)

    # --- picking a pass ---

    def _column_at(self, x: int) -> int | None:
        image, data = self.image, self.data
        if image is None or data is None:
            return None
        column = x - image.left - 1
        return column if 0 <= column < data.axis.columns else None

    def on_click(self, event: Click) -> None:
        offset = event.get_content_offset(self)
        column = None if offset is None else self._column_at(offset.x)
        if column is not None and self.data is not None:
            self.post_message(PassPicked(self.data.axis.pass_at(column)))

    def action_step(self, delta: int) -> None:
        data = self.data
        if data is None:
            return
        axis = data.axis
        column = max(0, min(axis.column_of(self.selected) + delta, axis.columns - 1))
        target = axis.pass_at(column)
        if (target - self.selected) * delta <= 0:  # the column holds no later (earlier) pass: step one pass
            target = max(0, min(self.selected + delta, len(axis.t_ns) - 1))
        self.post_message(PassPicked(target))


def _tint(strip: Strip, left: int, stalled: list[bool], band: str) -> Strip:
    """``strip`` with the cells of stalled columns (from cell ``left``) on the band's background."""
    cuts, styles, c = [], [], 0
    while c < len(stalled):
        start = c
        while c < len(stalled) and stalled[c] == stalled[start]:
            c += 1
        cuts.append(left + c)
        styles.append(stalled[start])
    if not any(styles):
        return strip
    pieces = strip.divide([left, *cuts, max(strip.cell_length, left + len(stalled))])
    out = [pieces[0]]
    background = Style(bgcolor=band)
    for piece, stalled_run in zip(pieces[1:], styles):
        out.append(Strip([Segment(t, (s or Style()) + background, c) for t, s, c in piece]) if stalled_run else piece)
    out.extend(pieces[1 + len(styles):])
    return Strip.join(out)


def _stall_cell(stalled: tuple[bool, ...]) -> Segment:
    """One events cell for the arms' stalls: the upper half is the first arm's, the lower the second's."""
    colours = [palette.rgb(colour.rgb).color for colour in palette.ARM_COLOURS]
    if len(stalled) == 1:
        return Segment("█", Style(color=colours[0])) if stalled[0] else Segment(" ")
    upper, lower = (stalled + (False, False))[:2]
    if upper and lower:
        return Segment("▀", Style(color=colours[0], bgcolor=colours[1]))
    if upper:
        return Segment("▀", Style(color=colours[0]))
    return Segment("▄", Style(color=colours[1])) if lower else Segment(" ")
