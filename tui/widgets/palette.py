"""Every colour the browser uses, in one place: the views and the help screen's legend read these."""

from __future__ import annotations

from typing import Final, NamedTuple

from rich.style import Style


class ArmColour(NamedTuple):
    rgb: tuple[int, int, int]  # the arm's own colour: its gutter mark and the charts' band edge
    band: str  # the background of its stalled passes

    @property
    def mark(self) -> Style:
        return Style(color=f"rgb{self.rgb}", bold=True)

    @property
    def background(self) -> Style:
        return Style(bgcolor=self.band)


# Stall bands, by the arm's place: the old arm (or the recording), then the new one.
ARM_COLOURS: Final = (ArmColour((255, 135, 0), "#5a3000"), ArmColour((95, 175, 255), "#0a3560"))
STALL_BAR: Final = "┃"  # an arm's gutter mark on a stalled pass

RESULT_STYLES: Final = {
    "error": Style(color="red", bold=True),
    "admit": Style(color="green"),
    "chunk": Style(color="cyan"),
    "full": Style(color="yellow"),
    "no-token": Style(color="magenta"),
    "none": Style(dim=True),
}
RESULT_MEANINGS: Final = {
    "admit": "admitted a new request",
    "chunk": "ran the continuing chunk only",
    "full": "admitted nothing; batch_is_full set",
    "no-token": "admitted nothing; the KV check refused",
    "none": "admitted nothing else",
    "error": "the pass raised",
}
MARK_STYLES: Final = {"error": Style(color="red", bold=True), "divergence": Style(color="bright_magenta", bold=True),
                      "stall": Style(color="yellow"), "desync": Style(color="bright_cyan", bold=True),
                      "gap": Style(color="bright_white", bgcolor="red", bold=True),
                      "loss": Style(color="bright_yellow", bold=True)}
MARK_MEANINGS: Final = {"error": "the pass raised, or a KV allocation failed after it",
                        "gap": "unreadable bytes in the file: the first pass lost there (its lost passes too)",
                        "divergence": "the two arms decide differently",
                        "desync": "the ranks that must agree (one TP or attention-TP group) differ here",
                        "loss": "the recorder dropped records after this pass (a loss record)"}
LOST_PASS: Final = Style(color="red", italic=True)  # a pass-list line for a pass lost in a gap
DIVERGENT_SEQ: Final = Style(color="bright_magenta", bold=True)  # a divergent pass's number in the list
SEARCHED: Final = Style(color="black", bgcolor="yellow", bold=True)  # the rid found with /

# The charts (plotext takes RGB tuples; the legends draw the same colours).
KV_FREE: Final = (0, 175, 95)
KV_EVICTABLE: Final = (0, 135, 175)
KV_USED: Final = (88, 88, 88)
HEAD_NEED: Final = (255, 95, 95)
QUEUE: Final = (255, 215, 0)
RUNNING: Final = (95, 215, 95)
CAPACITY: Final = (128, 128, 128)

# The reasons ``analysis.why`` gives, as the detail pane and the list colour them.
WHY_STYLES: Final = {
    "latch": Style(color="rgb(255,135,0)", bold=True),
    "stall": Style(color="rgb(255,135,0)", bold=True),
    "back-pressure": Style(color="yellow"),
    "full": Style(color="yellow"),
    "error": Style(color="red", bold=True),
    "drained": Style(color="green"),
}


def rgb(colour: tuple[int, int, int]) -> Style:
    return Style(color=f"rgb{colour}")
