"""The timeline: one sparkline per series over every pass, with event marks.

Series are max-downsampled into one bucket per terminal column (peaks stay
visible); the app computes the buckets in a worker and hands them over.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click, Resize
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from schedtrace.tui.messages import PassPicked, TimelineResized
from schedtrace.tui.model.marks import GLYPHS
from schedtrace.tui.model.scan import SERIES
from schedtrace.tui.model.series import TimelineData, bucket_of, pass_of_bucket, sparkline

LABELS = {"waiting": "queue", "running": "running", "kv_free": "kv free", "kv_evictable": "kv evict",
          "chunk": "chunk"}
COLORS = {"waiting": "yellow", "running": "green", "kv_free": "blue", "kv_evictable": "cyan", "chunk": "magenta"}
LABEL_WIDTH = 9
MARK_STYLES = {GLYPHS["divergence"]: Style(color="bright_magenta", bold=True),
               GLYPHS["error"]: Style(color="red", bold=True), GLYPHS["stall"]: Style(color="yellow", bold=True)}


def _runs(body: str, split: bool) -> list[tuple[int, str]]:
    """(start, text) runs of equal characters in ``body`` (or the whole body when not ``split``)."""
    if not split:
        return [(0, body)] if body else []
    runs, start = [], 0
    for i in range(1, len(body) + 1):
        if i == len(body) or body[i] != body[start]:
            runs.append((start, body[start:i]))
            start = i
    return runs


class Timeline(Widget, can_focus=True):
    """The app binds ``data``, ``selected`` (the cursor column) and ``note`` (shown until data comes)."""

    BINDINGS = [
        Binding("left", "step(-1)", "Earlier", show=False),
        Binding("right", "step(1)", "Later", show=False),
    ]
    DEFAULT_CSS = """
    Timeline { height: 7; border-bottom: solid $primary-darken-2; }
    """

    data: reactive[TimelineData | None] = reactive(None, init=False)
    selected: reactive[int] = reactive(0, init=False)
    note: reactive[str] = reactive("", init=False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows_for: TimelineData | None = None
        self._rows: dict[int, tuple[str, str, Style | None, str]] = {}

    @property
    def buckets(self) -> int:
        return max(self.size.width - LABEL_WIDTH - 8, 1)

    def on_resize(self, event: Resize) -> None:
        self.post_message(TimelineResized(self.buckets))

    def _cursor_bucket(self) -> int | None:
        if self.data is None or not self.data.passes:
            return None
        return bucket_of(self.selected, 0, self.data.passes, self.data.buckets)

    def _row(self, y: int) -> tuple[str, str, Style | None, str] | None:
        """(label, body, body style or None for per-mark styles, peak) of row ``y``, cached per data."""
        data = self.data
        assert data is not None
        if self._rows_for is not data:
            self._rows_for, self._rows = data, {}
        row = self._rows.get(y)
        if row is None and y < len(SERIES):
            name = SERIES[y]
            body = sparkline(data.series[name], data.peaks[name] or None)
            row = self._rows[y] = (LABELS[name], body, Style(color=COLORS[name]), f" {data.peaks[name]:>6}")
        elif row is None and y == len(SERIES):
            row = self._rows[y] = ("events", data.marks, None, "")
        return row

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        data = self.data
        rows = len(SERIES)
        if data is None or data.buckets == 0:
            text = self.note if y == rows // 2 else ""
            return Strip([Segment(text[:width], Style(dim=True))]).extend_cell_length(width)
        row = self._row(y)
        if row is None:
            return Strip.blank(width)
        label, body, style, peak = row
        cursor = self._cursor_bucket()
        segments = [Segment(f"{label:<{LABEL_WIDTH}}", Style(bold=True))]
        # Runs of one style become one segment: a row is a handful of segments, not one per cell.
        for i, ch in _runs(body, style is None):
            cell_style = MARK_STYLES.get(ch[0], Style()) if style is None else style
            if cursor is not None and i <= cursor < i + len(ch):
                at = cursor - i
                if at:
                    segments.append(Segment(ch[:at], cell_style))
                mark = ch[at] if ch[at] != " " else "│"
                segments.append(Segment(mark, cell_style + Style(reverse=True)))
                if at + 1 < len(ch):
                    segments.append(Segment(ch[at + 1:], cell_style))
            else:
                segments.append(Segment(ch, cell_style))
        segments.append(Segment(peak, Style(dim=True)))
        return Strip(segments).extend_cell_length(width).crop(0, width)

    def on_click(self, event: Click) -> None:
        if self.data is None or not self.data.passes:
            return
        offset = event.get_content_offset(self)
        if offset is None:
            return
        bucket = offset.x - LABEL_WIDTH
        if 0 <= bucket < self.data.buckets:
            self.post_message(PassPicked(pass_of_bucket(bucket, 0, self.data.passes, self.data.buckets)))

    def action_step(self, delta: int) -> None:
        cursor = self._cursor_bucket()
        if cursor is None or self.data is None:
            return
        bucket = max(0, min(cursor + delta, self.data.buckets - 1))
        target = pass_of_bucket(bucket, 0, self.data.passes, self.data.buckets)
        if target == self.selected:
            target = max(0, min(self.selected + delta, self.data.passes - 1))
        self.post_message(PassPicked(target))
