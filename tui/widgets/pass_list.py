"""The pass list: one line per pass, virtual over the trace index.

Like toolong's log view, only the visible lines are decoded (through a small
LRU cache), so a million-pass trace scrolls as fast as a ten-pass one. Each
line starts with the event mark (a pass lost in a gap is one line saying
where) and one gutter cell per arm; a pass inside
an arm's stall has that arm's bar in its cell and the whole line on the
arm's band colour. Where the list is wide enough, each line ends with why
nothing (more) was admitted.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.reactive import reactive, var
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from schedtrace.tracer.contract.errors import TraceDamagedError
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tui.messages import CursorMoved
from schedtrace.tui.model.marks import GLYPHS, Marks
from schedtrace.tui.model.pass_cache import PassCache
from schedtrace.tui.model.rows import PASS_HEADER, ListedPasses, PassRow, pass_row
from schedtrace.tui.model.why_lines import WhyLines
from schedtrace.tui.widgets import palette

CURSOR = Style(reverse=True)
CURSOR_FOCUSED = Style(reverse=True, bold=True)
NO_MARKER = (" ", None)
BAND_CELLS = 2  # gutter cells, one per arm (the old and the new arm, or the recording alone)
MIN_WHY = 16  # narrower than this, the why column is left out
SCROLLBAR = 2  # the list's vertical scrollbar (Textual's default size)
WHY_STYLE = Style(dim=True)


def format_row(row: PassRow) -> tuple[str, str]:
    """(the pass number, the other columns) of one line."""
    header = row.seq < 0
    seq = "pass" if header else str(row.seq)
    waiting = "wait" if header else str(row.waiting)
    running = "run" if header else str(row.running)
    return (f"{seq:>7}", f" {row.time:>8} {waiting:>4} {running:>3} {row.kv:>11} {row.admitted:<10} "
                         f"{row.chunk:>5} {row.result:<8}")


ROW_WIDTH = 2 + BAND_CELLS + sum(map(len, format_row(PASS_HEADER)))  # mark, space, gutter, the columns
WHY_HEADER = " why nothing (more) was admitted"


def why_room(width: int) -> int:
    """Cells left for the why column on a list line ``width`` cells wide."""
    return width - ROW_WIDTH - 1


class ListHeader(Widget):
    """The pass list's column names, above it (the why column's only when the list shows it)."""

    DEFAULT_CSS = """
    ListHeader { height: 1; }
    """

    def render(self) -> Text:
        columns = " " * (2 + BAND_CELLS) + "".join(format_row(PASS_HEADER))
        list_width = self.size.width - SCROLLBAR
        return Text(columns + (WHY_HEADER if why_room(list_width) >= MIN_WHY else ""), no_wrap=True)


class PassList(ScrollView, can_focus=True):
    """Rows are pass numbers: all of them, or a filter's matches.

    The app binds ``listed``, ``selected`` and ``marks``; the cursor follows
    ``selected`` (and centres a row it jumps to) and reports its own moves
    with ``CursorMoved``.
    """

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup,ctrl+b", "page(-1)", "Page up", show=False),
        Binding("pagedown,ctrl+f", "page(1)", "Page down", show=False),
        Binding("home", "edge(0)", "First", show=False),
        Binding("end,G", "edge(1)", "Last", show=False),
    ]
    DEFAULT_CSS = """
    PassList { height: 1fr; }
    """

    listed: var[ListedPasses] = var(ListedPasses(0), always_update=True, init=False)  # watch_listed repaints
    selected: var[int] = var(0, init=False)  # the app's selected pass; the cursor's move repaints
    marks: reactive[Marks] = reactive(Marks, init=False)
    cursor: reactive[int] = reactive(0, always_update=True)

    def __init__(self, cache: PassCache, why: WhyLines, **kwargs) -> None:
        super().__init__(**kwargs)
        self.cache = cache
        self.why = why
        self.decode_failure: str | None = None
        self._line_style: Style | None = None
        self._centre = False  # the next cursor move is a jump: centre its row

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
        self.virtual_size = Size(ROW_WIDTH, len(listed))
        self._centre = True
        self.cursor = listed.row_of(self.selected) if len(listed) else 0
        self.refresh()

    def watch_selected(self, pass_no: int) -> None:
        if self.row_count and self.selected_pass != pass_no:
            self._centre = True  # a jump (n, s, g, a chart, the request view): not a step of the cursor
            self.cursor = self.listed.row_of(pass_no)

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
        centre, self._centre = self._centre, False
        # force: new rows can arrive before the layout that gives them a scrollbar (a filter
        # with no match, then cleared), and without one the scroll would be refused.
        if centre:
            self.scroll_to(y=max(self.cursor - height // 2, 0), animate=False, immediate=True, force=True)
        elif self.cursor < top:
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

    def _gutter(self, pass_no: int) -> tuple[list[tuple[str, Style | None]], Style | None]:
        """The mark, the arms' cells, and the band colour of the line (None: no stall)."""
        marks = self.marks
        kind = marks.kind_at(pass_no)
        mark = NO_MARKER if kind in (None, "stall") else (GLYPHS[kind], palette.MARK_STYLES[kind])
        cells: list[tuple[str, Style | None]] = [mark, (" ", None)]
        band = None
        stalled = marks.stalled_arms(pass_no)
        for i in range(BAND_CELLS):
            if i < len(stalled) and stalled[i]:
                colour = palette.ARM_COLOURS[i]
                cells.append((palette.STALL_BAR, colour.mark))
                band = band or colour.background
            else:
                cells.append((" ", None))
        return cells, band

    def _segments(self, pass_no: int, p: Pass, width: int) -> tuple[list[tuple[str, Style | None]], Style | None]:
        data = pass_row(p)
        cells, band = self._gutter(pass_no)
        seq, rest = format_row(data)
        divergent = self.marks.is_divergence(pass_no)
        cells.append((seq, palette.DIVERGENT_SEQ if divergent else palette.RESULT_STYLES.get(data.result)))
        cells.append((rest, palette.RESULT_STYLES.get(data.result)))
        room = why_room(width)
        if room >= MIN_WHY:
            line = self.why.of(pass_no, p)
            text = line.text if len(line.text) <= room else line.text[: room - 1] + "…"
            cells.append((" " + text, palette.WHY_STYLES.get(line.reason, WHY_STYLE)))
        return cells, band

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.scrollable_content_region.width
        base = self._line_style if self._line_style is not None else self.rich_style
        if row >= self.row_count:
            return Strip.blank(width, base)
        pass_no = self.pass_of(row)
        try:
            segments, band = self._segments(pass_no, self.cache.get(pass_no), width)
        except TraceDamagedError as exc:  # lost in a gap (read past with skip_damaged): say where
            gap = exc.gap
            segments, band = [(GLYPHS["gap"], palette.MARK_STYLES["gap"]),
                              (f" {' ' * BAND_CELLS}{pass_no:>7} lost in the gap at bytes {gap.start:,}–{gap.end:,}",
                               palette.LOST_PASS)], None
        except Exception as exc:  # a corrupt record: show it on its line, keep browsing
            self.decode_failure = str(exc)
            segments, band = [(f"  {pass_no:>8} unreadable: {exc}"[:ROW_WIDTH], Style(color="red"))], None
        if band is not None:
            base = base + band
        if row == self.cursor:
            base = base + (CURSOR_FOCUSED if self.has_focus else CURSOR)
        # One strip, styles already combined (base, then band and cursor, then the segment's own).
        used = sum(cell_len(text) for text, _ in segments)
        line = [Segment(text, base + style if style else base) for text, style in segments]
        full = max(width, ROW_WIDTH)
        if used < full:
            line.append(Segment(" " * (full - used), base))
        strip = Strip(line, max(used, full))
        if scroll_x or strip.cell_length > width:
            strip = strip.crop(scroll_x, scroll_x + width)
        return strip

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
