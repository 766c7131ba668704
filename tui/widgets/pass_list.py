"""The pass list: one line per pass, virtual over the trace index.

Like toolong's log view, only the visible lines are decoded (through a small
LRU cache), so a million-pass trace scrolls as fast as a ten-pass one.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from schedtrace.tui.model import PASS_HEADER, PassCache, PassRow, pass_row

RESULT_STYLES = {
    "error": Style(color="red", bold=True),
    "admit": Style(color="green"),
    "chunk": Style(color="cyan"),
    "full": Style(color="yellow"),
    "no-token": Style(color="magenta"),
    "none": Style(dim=True),
}
ROW_WIDTH = 78
CURSOR = Style(reverse=True)
CURSOR_FOCUSED = Style(reverse=True, bold=True)

# marker(pass) -> (one character, style)
MarkerFn = Callable[[int], tuple[str, Style]]


def format_row(row: PassRow) -> str:
    seq = "pass" if row.seq < 0 else str(row.seq)
    waiting = "wait" if row.seq < 0 else str(row.waiting)
    running = "run" if row.seq < 0 else str(row.running)
    return (f"{seq:>8} {row.time:>10} {waiting:>5} {running:>4} {row.kv:>13} "
            f"{row.admitted:<22} {row.result:<8}")


HEADER_TEXT = "  " + format_row(PASS_HEADER)


class PassList(ScrollView, can_focus=True):
    """Rows are pass numbers: all of them, or a filter's matches."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end", "edge(1)", "Last", show=False),
    ]
    DEFAULT_CSS = """
    PassList { height: 1fr; }
    """

    cursor: reactive[int] = reactive(0, always_update=True)

    @dataclass
    class Selected(Message):
        """The cursor moved onto ``pass_no``."""

        pass_no: int

    def __init__(self, cache: PassCache, *, marker: MarkerFn | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cache = cache
        self.marker = marker
        self._count = 0
        self._rows: array | None = None  # filter matches; None = every pass
        self.decode_failure: str | None = None
        self._line_style: Style | None = None

    # --- rows ---

    @property
    def row_count(self) -> int:
        return len(self._rows) if self._rows is not None else self._count

    def set_rows(self, count: int, rows: array | None = None, keep_pass: int | None = None) -> None:
        """Show ``count`` passes, or only ``rows`` (ascending pass numbers)."""
        self._count = count
        self._rows = rows
        self.virtual_size = Size(ROW_WIDTH + 2, self.row_count)
        if keep_pass is not None and self.row_count:
            self.cursor = self.row_of(keep_pass)
        else:
            self.cursor = min(self.cursor, max(self.row_count - 1, 0))
        self.refresh()

    def pass_of(self, row: int) -> int:
        return self._rows[row] if self._rows is not None else row

    def row_of(self, pass_no: int) -> int:
        """The row showing ``pass_no``, or the nearest one after it."""
        if self._rows is None:
            return max(0, min(pass_no, self._count - 1))
        return min(bisect_left(self._rows, pass_no), max(len(self._rows) - 1, 0))

    @property
    def selected_pass(self) -> int | None:
        return self.pass_of(self.cursor) if self.row_count else None

    def select_pass(self, pass_no: int) -> None:
        if self.row_count:
            self.cursor = self.row_of(pass_no)

    # --- cursor ---

    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, self.row_count - 1)) if self.row_count else 0

    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_cursor_into_view()
        self.refresh()
        if self.row_count:
            self.post_message(self.Selected(self.pass_of(new)))

    def _scroll_cursor_into_view(self) -> None:
        height = self.scrollable_content_region.height or 1
        top = int(self.scroll_y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False, immediate=True)

    def action_cursor(self, delta: int) -> None:
        self.cursor += delta

    def action_page(self, direction: int) -> None:
        self.cursor += direction * max(self.scrollable_content_region.height - 1, 1)

    def action_edge(self, end: int) -> None:
        self.cursor = self.row_count - 1 if end else 0

    def on_click(self, event: Click) -> None:
        row = int(self.scroll_y) + event.y
        if 0 <= row < self.row_count:
            self.cursor = row

    # --- rendering ---

    def render_lines(self, crop: Region) -> list[Strip]:
        # Look the widget's style up once per paint, not once per line.
        self._line_style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.scrollable_content_region.width
        base = self._line_style if self._line_style is not None else self.rich_style
        if row >= self.row_count:
            return Strip.blank(width, base)
        pass_no = self.pass_of(row)
        try:
            data = pass_row(self.cache.get(pass_no))
        except Exception as exc:  # a corrupt record: show it on its line, keep browsing
            self.decode_failure = str(exc)
            segments = [(f"  {pass_no:>8} unreadable: {exc}"[: ROW_WIDTH], Style(color="red"))]
        else:
            mark, mark_style = self.marker(pass_no) if self.marker else (" ", None)
            segments = [(mark, mark_style), (" ", None), (format_row(data), RESULT_STYLES.get(data.result))]
        if row == self.cursor:
            base = base + (CURSOR_FOCUSED if self.has_focus else CURSOR)
        # One strip, styles already combined (base, then cursor, then the segment's own).
        used = sum(cell_len(text) for text, _ in segments)
        line = [Segment(text, base + style if style else base) for text, style in segments]
        if used < ROW_WIDTH + 2:
            line.append(Segment(" " * (ROW_WIDTH + 2 - used), base))
        strip = Strip(line, max(used, ROW_WIDTH + 2))
        if scroll_x or strip.cell_length > width:
            strip = strip.crop(scroll_x, scroll_x + width)
        return strip

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
