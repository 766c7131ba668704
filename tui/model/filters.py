"""Pass filters: what the user types after ``f``, and the passes that match."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from schedtrace.tracer.analysis.outcome import OUTCOMES
from schedtrace.tui.model.marks import Marks
from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.rids import short_rid
from schedtrace.tui.model.scan import OUTCOME_CODE

SYNTAX: Final = "divergent | fix NAME | result WORD | stall [ARM] | rid ID | !…"


@dataclass(frozen=True)
class PassFilter:
    """``kind`` is "divergent", "fix" (``value`` a fix name), "result" (an OUTCOMES word),
    "stall" (``value`` an arm, or "" for any) or "rid" (``value`` a rid or a prefix of one)."""

    kind: str
    value: str = ""
    inverse: bool = False

    def describe(self) -> str:
        what = {"divergent": "divergent", "fix": f"fix={self.value}", "result": f"result={self.value}",
                "stall": f"stall{'=' + self.value if self.value else ''}", "rid": f"rid={short_rid(self.value)}"}
        return ("not " if self.inverse else "") + what[self.kind]

    @property
    def needs_replay(self) -> bool:
        return self.kind in ("divergent", "fix")

    @classmethod
    def parse(cls, text: str) -> PassFilter:
        """``divergent``, ``fix NAME``, ``result WORD``, ``stall [ARM]``, ``rid ID``; ``!`` or ``not`` inverts."""
        text = text.strip()
        inverse = False
        if text.startswith("!"):
            inverse, text = True, text[1:].strip()
        elif text.startswith("not "):
            inverse, text = True, text[4:].strip()
        word, _, value = text.partition(" ")
        word, value = word.strip().lower(), value.strip()
        if word in ("divergent", "div", "d"):
            return cls("divergent", inverse=inverse)
        if word in ("fix", "f") and value:
            return cls("fix", value, inverse)
        if word in ("result", "r") and value in OUTCOMES:
            return cls("result", value, inverse)
        if word in ("stall", "stalls", "s"):
            return cls("stall", value, inverse)
        if word == "rid" and value:
            return cls("rid", value, inverse)
        raise ValueError(f"unknown filter {text!r}: use {SYNTAX.replace(' | !…', '')}, with '!' in front to invert")


@dataclass(frozen=True)
class FilterInputs:
    """What the filters read; ``rid_passes`` reads the trace (only a thread worker calls it)."""

    passes: int
    replay: ReplayIndex
    marks: Marks
    results: Sequence[int] | None  # the scan's outcome codes (None: not scanned yet)
    rid_passes: Callable[[str], Sequence[int]]  # pass numbers that mention a full rid


def _matching(flt: PassFilter, inputs: FilterInputs) -> Sequence[int]:
    """The passes ``flt`` names (before inversion), ascending."""
    replay, marks = inputs.replay, inputs.marks
    if flt.kind == "divergent":
        return sorted(replay.divergences)
    if flt.kind == "fix":
        return sorted(n for n, d in replay.divergences.items() if flt.value in d.fixes)
    if flt.kind == "stall":
        if flt.value and flt.value not in marks.arms:
            raise ValueError(f"no arm {flt.value!r}: stalls are marked for {', '.join(marks.arms) or 'no arm'}")
        chosen = {n for run in marks.stall_runs(flt.value or None) for n in range(run.start, run.end + 1)}
        return sorted(chosen)
    if flt.kind == "rid":
        return inputs.rid_passes(flt.value)
    results = inputs.results
    if results is None:
        raise ValueError("result filters need the trace scan to finish first")
    code = OUTCOME_CODE[flt.value]
    return [n for n in range(min(inputs.passes, len(results))) if results[n] == code]


def apply_filter(flt: PassFilter, inputs: FilterInputs) -> array:
    """Pass numbers that match ``flt``, ascending."""
    matching = [n for n in _matching(flt, inputs) if 0 <= n < inputs.passes]
    if not flt.inverse:
        return array("q", matching)
    chosen = set(matching)
    return array("q", (n for n in range(inputs.passes) if n not in chosen))
