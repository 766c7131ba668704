"""The help screen: every key (the app's and each pane's), and a legend of every mark, colour and word."""

from __future__ import annotations

from typing import Final

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from schedtrace.tracer.analysis import why
from schedtrace.tui.model.marks import GLYPHS, POINT_KINDS
from schedtrace.tui.widgets import palette

# What each of analysis.why's reasons means (the words are why.py's).
WHY_MEANINGS: Final = {
    why.LATCH: "batch_is_full stayed latched although the head fits: the latch fix admits it",
    why.STALL: "the check admits the head, yet the arm admitted nothing, and no latch explains it",
    why.BACK_PRESSURE: "the head's need is not below the KV budget: waiting is right",
    why.FULL: "no request slot left",
    why.PASS_BUDGET: "this pass's chunk or input token budget is spent",
    why.ONE_CHUNK: "the head needs a chunk while another chunked request is unfinished",
    why.EMPTY_CUT: "the head's chunk rounds down to nothing",
    why.DRAINED: "everyone waiting got in",
    why.ERROR: "the pass raised",
}


HEADER_WORDS: Final = (  # (label, value, meaning): the header's words about ranks and damage
    ("rank", "tp1 2/4", "the rank shown, of the run's ranks in (pp, dp, tp) order: [ and ] switch"),
    ("ranks", "agree (tp)", "the ranks' comparison found no difference (its mode: tp, dp-attention or dp)"),
    ("ranks", "DESYNC 3 passes", "passes of this rank where its group disagrees (d jumps)"),
    ("", "DAMAGED", "the file has unreadable regions: how many, and the passes they lost (i lists them)"),
    ("lost", "7", "records the recorder dropped (loss records; x jumps to each)"),
)


def key_label(key: str) -> str:
    """A binding's keys as the help shows them (``question_mark`` → ``?``)."""
    names = {"slash": "/", "question_mark": "?", "left": "←", "right": "→", "up": "↑", "down": "↓",
             "left_square_bracket": "[", "right_square_bracket": "]"}
    return "/".join(names.get(k, k) for k in key.split(","))


def pane_keys(widget: type) -> list[tuple[str, str]]:
    """(keys, what) of every binding ``widget`` has: its own over those it inherits, keys of one action together."""
    action_of: dict[str, tuple[str, str]] = {}  # one key -> (action, description)
    for cls in reversed(widget.__mro__):
        for binding in getattr(cls, "BINDINGS", ()):
            if isinstance(binding, Binding) and binding.description:
                for key in binding.key.split(","):
                    action_of[key.strip()] = (binding.action, binding.description)
    keys_of: dict[str, list[str]] = {}
    what: dict[str, str] = {}
    for key, (action, description) in action_of.items():
        keys_of.setdefault(action, []).append(key)
        what[action] = description
    return [(key_label(",".join(keys)), what[action]) for action, keys in keys_of.items()]


def _section(text: Text, title: str) -> None:
    text.append(f"\n{title}\n", style="bold underline")


def keys_text(keys: list[tuple[str, list[tuple[str, str]]]]) -> Text:
    """``keys``: (where, [(keys, what)]) per place the keys work."""
    text = Text()
    for where, bindings in keys:
        _section(text, f"Keys: {where}")
        for key, what in bindings:
            text.append(f"  {key:<16}", style="bold")
            text.append(f"{what}\n")
    return text


def legend_text(arms: tuple[str, ...]) -> Text:
    """Every mark, colour and word the views show; ``arms``: the arms whose stalls are banded."""
    text = Text()
    _section(text, "Marks (first column of the pass list, the charts' events line)")
    for kind in POINT_KINDS:
        text.append("  ")
        text.append(GLYPHS[kind], style=palette.MARK_STYLES[kind])
        text.append(f"  {kind}: {palette.MARK_MEANINGS[kind]}\n")
    text.append("  7 lost in the gap …", style=palette.LOST_PASS)
    text.append("  a pass-list line for a pass a gap lost (i lists the gaps and losses)\n")
    _section(text, "Header (the top line)")
    for label, value, meaning in HEADER_WORDS:
        text.append(f"  {label} ", style="dim")
        text.append(value, style="bold red" if value.isupper() else "bold")
        text.append(f"  {meaning}\n")
    _section(text, "Stall bands (a stall: the check would admit, the arm admits nothing, for several passes)")
    for i, arm in enumerate(arms[: len(palette.ARM_COLOURS)]):
        colour = palette.ARM_COLOURS[i]
        text.append(f"  {palette.STALL_BAR} ", style=colour.mark)
        text.append("  band  ", style=colour.background)
        text.append(f" stalled passes of {arm} (gutter cell {i + 1}; "
                    f"{'upper' if i == 0 and len(arms) > 1 else 'lower' if i else 'all'} rows of the charts)\n")
    _section(text, "Result words (what the pass did)")
    for word, meaning in palette.RESULT_MEANINGS.items():
        text.append(f"  {word:<10}", style=palette.RESULT_STYLES[word])
        text.append(f"{meaning}\n")
    _section(text, "Why nothing (more) was admitted (the scheduler's own check, after earlier admissions)")
    for reason, meaning in WHY_MEANINGS.items():
        text.append(f"  {reason:<14}", style=palette.WHY_STYLES.get(reason, "bold"))
        text.append(f"{meaning}\n")
    _section(text, "Charts (x: time since the recorder started; one column per slice of time)")
    for colour, label in ((palette.KV_FREE, "free KV tokens"), (palette.KV_EVICTABLE, "evictable (cached)"),
                          (palette.KV_USED, "used, up to max_total_tokens")):
        text.append("  █ ", style=palette.rgb(colour))
        text.append(f"{label}\n")
    text.append("  ─ ", style=palette.rgb(palette.HEAD_NEED))
    text.append("head request's need: above the top of the evictable band, it does not fit\n")
    for colour, label in ((palette.QUEUE, "requests waiting"), (palette.RUNNING, "requests running"),
                          (palette.CAPACITY, "max_running_requests")):
        text.append("  ─ ", style=palette.rgb(colour))
        text.append(f"{label}\n")
    text.append("  ▌ ", style="reverse")
    text.append("the selected pass's column\n")
    _section(text, "Mouse")
    text.append("  click a pass, or a chart's column.  ctrl+p: every action.  escape closes this.\n")
    return text


class HelpScreen(ModalScreen[None]):
    """The keys on the left, the legend on the right; j/k scroll both."""

    BINDINGS = [
        Binding("escape,q,question_mark", "close", "Close"),
        Binding("j,down", "scroll(1)", "Down", show=False),
        Binding("k,up", "scroll(-1)", "Up", show=False),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Horizontal { width: 96%; max-width: 170; height: 92%; border: thick $primary;
                              background: $surface; }
    HelpScreen VerticalScroll { padding: 0 2; }
    HelpScreen #help-keys { width: 46; }
    """

    def __init__(self, keys: Text, legend: Text) -> None:
        super().__init__()
        self.keys, self.legend = keys, legend

    @property
    def text(self) -> Text:
        return Text.assemble(self.keys, "\n", self.legend)

    def compose(self) -> ComposeResult:
        with Horizontal():
            with VerticalScroll(id="help-keys"):
                yield Static(self.keys)
            with VerticalScroll(id="help-legend"):
                yield Static(self.legend)

    def action_scroll(self, delta: int) -> None:
        for scroll in self.query(VerticalScroll):
            scroll.scroll_relative(y=delta, animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
