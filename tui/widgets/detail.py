"""The detail pane: a line-based scroll view over ``pass_detail``'s lines."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip


class DetailPane(ScrollView):
    """Shows ``lines`` (the app binds them), one strip per line, cropped not wrapped
    (a line whose ``overflow`` is "fold" is folded to the pane's width instead).

    A ``Static`` in a scroll container re-renders its whole content to measure
    its height and re-lays out the screen on every update; here an update
    turns each line into one strip and only the visible strips are drawn.
    """

    BINDINGS = [
        Binding("j", "scroll_down", "Scroll Down", show=False),
        Binding("k", "scroll_up", "Scroll Up", show=False),
    ]
    DEFAULT_CSS = """
    DetailPane { width: 1fr; padding: 0 1; }
    """

    lines: var[list[Text]] = var(list, always_update=True, init=False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._strips: list[Strip] | None = None
        self._shown: dict[int, Strip] = {}  # line -> strip as drawn for _shown_key
        self._shown_key: tuple[Style | None, int, int] = (None, -1, -1)  # (widget style, scroll x, width)
        self._folded_at = 0  # the width folded lines were folded to

    @property
    def renderable(self) -> RenderableType:
        """Everything shown, as one renderable (for printing and tests)."""
        return Group(*self.lines)

    def watch_lines(self) -> None:
        self._strips = None
        self._build_strips()
        self.scroll_to(0, 0, animate=False, immediate=True)
        self.refresh()

    def _build_strips(self) -> list[Strip]:
        console = self.app.console
        strips = []
        fold_width = self._folded_at = max(self.scrollable_content_region.width, 20)
        for text in self.lines:
            if text.overflow == "fold":
                pieces = list(text.wrap(console, fold_width))
            else:
                pieces = text.split("\n") if "\n" in text.plain else [text]  # a multi-line error message
            for line in pieces:
                strips.append(Strip(line.render(console), line.cell_len))
        self._strips = strips
        self._shown = {}
        width = max((strip.cell_length for strip in strips), default=0)
        self._set_virtual_size(Size(width, len(strips)))
        return strips

    def _set_virtual_size(self, size: Size) -> None:
        """Like assigning ``virtual_size``, but without a screen re-layout when no scrollbar comes or goes.

        A re-layout reflows every widget on screen; moving from one long pass to
        another only changes the scrollbar's thumb.
        """
        old, view = self.virtual_size, self.scrollable_content_region.size
        same_bars = (old.height > view.height) == (size.height > view.height) and (
            (old.width > view.width) == (size.width > view.width))
        if not (same_bars and self.is_mounted and view.area):
            self.virtual_size = size
            return
        self.set_reactive(DetailPane.virtual_size, size)
        self._scroll_update(size)

    def on_resize(self) -> None:
        if self.scrollable_content_region.width != self._folded_at:
            self._strips = None  # fold again to the new width
            self.refresh()

    def _check_shown_key(self) -> None:
        key = (self.rich_style, self.scroll_offset.x, self.scrollable_content_region.width)
        if key != self._shown_key:
            self._shown_key, self._shown = key, {}

    def render_lines(self, crop: Region) -> list[Strip]:
        self._check_shown_key()  # once per paint: the widget's style is costly to look up per line
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        if self._shown_key[2] < 0:
            self._check_shown_key()
        style, scroll_x, width = self._shown_key
        strips = self._strips if self._strips is not None else self._build_strips()
        row = self.scroll_offset.y + y
        shown = self._shown.get(row)
        if shown is None:
            if row >= len(strips):
                shown = Strip.blank(width, style)
            else:
                shown = strips[row].crop_extend(scroll_x, scroll_x + width, style).apply_style(style)
            self._shown[row] = shown
        return shown
