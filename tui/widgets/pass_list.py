"""The pass list: one line per pass, virtual over the trace index.

Like toolong's log view, only the visible lines are decoded (through a small
LRU cache), so a million-pass trace scrolls as fast as a ten-pass one.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.reactive import reactive, var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from schedtrace.tui.messages import CursorMoved
from schedtrace.tui.model.marks import GLYPHS, Marks
from schedtrace.tui.model.pass_cache import PassCache
from schedtrace.tui.model.rows import PASS_HEADER, ListedPasses, PassRow, pass_row

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
MARKER_STYLES = {"error": Style(color="red", bold=True), "divergence": Style(color="bright_magenta", bold=True),
                 "stall": Style(color="yellow")}
NO_MARKER = (" ", None)


def format_row(row: PassRow) -> str:
    seq = "pass" if row.seq < 0 else str(row.seq)
    waiting = "wait" if row.seq < 0 else str(row.waiting)
    running = "run" if row.seq < 0 else str(row.running)
    return (f"{seq:>8} {row.time:>10} {waiting:>5} {running:>4} {row.kv:>13} "
            f"{row.admitted:<22} {row.result:<8}")


HEADER_TEXT = "  " + format_row(PASS_HEADER)


class PassList(ScrollView, can_focus=True):
    """Rows are pass numbers: all of them, or a filter's matches.

    The app binds ``listed``, ``selected`` and ``marks``; the cursor follows
    ``selected`` and reports its own moves with ``CursorMoved``.
    """

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

    listed: var[ListedPasses] = var(ListedPasses(0), always_update=True, init=False)  # watch_listed repaints
    selected: var[int] = var(0, init=False)  # the app's selected pass; the cursor's move repaints
    marks: reactive[Marks] = reactive(Marks, init=False)
    cursor: reactive[int] = reactive(0, always_update=True)

    def __init__(self, cache: PassCache, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cache = cache
        self.decode_failure: str | None = None
        self._line_style: Style | None = None

    # --- rows ---

    @property
    def row_count(self) -> int:
        return len(self.listed)

    def pass_of(self, row: int) -> int:
        return self.listed.pass_of(row)

    @property
    def selected_pass(self) -> int | None:
        return self.pass_of(self.cursor) if self.row_count else None

    def watch_listed(self, listed: ListedPasses) -> None:
        self.virtual_size = Size(ROW_WIDTH + 2, len(listed))
        self.cursor = listed.row_of(self.selected) if len(listed) else 0
        self.refresh()

    def watch_selected(self, pass_no: int) -> None:
        if self.row_count and self.selected_pass != pass_no:
            self.cursor = self.listed.row_of(pass_no)

    def _marker(self, pass_no: int) -> tuple[str, Style | None]:
        kind = self.marks.kind_at(pass_no)
        return NO_MARKER if kind is None else (GLYPHS[kind], MARKER_STYLES[kind])

    # --- cursor ---

    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, self.row_count - 1)) if self.row_count else 0

    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_cursor_into_view()
        self.refresh()
        if self.row_count:
            self.post_message(CursorMoved(self.pass_of(new)))

    def _scroll_cursor_into_view(self) -> None:
        height = self.scrollable_content_region.height or 1
        top = int(self.scroll_y)
        # force: new rows can arrive before the layout that gives them a scrollbar (a filter
        # with no match, then cleared), and without one the scroll would be refused.
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True, force=True)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False, immediate=True, force=True)

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
            mark, mark_style = self._marker(pass_no)
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
