"""Where the events are: sorted pass numbers per kind, for jumps, row marks and timeline marks.

Stalls are kept per arm (the replay's old and new arm, or "recorded" for the
trace alone): each arm's stalled passes get a band of their own colour.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from schedtrace.tui.model.replay_index import ReplayIndex
from schedtrace.tui.model.scan import ScanResult

# Each kind's glyph, most serious first: a pass that is several shows the first.
GLYPHS: Final = {"error": "✖", "gap": "▒", "divergence": "◆", "desync": "≠", "loss": "▽", "stall": "▬"}
POINT_KINDS: Final = tuple(kind for kind in GLYPHS if kind != "stall")  # marked at single passes
RECORDED: Final = "recorded"  # the arm of the trace's own decisions (no replay loaded)


def _has(points: array, n: int) -> bool:
    i = bisect_left(points, n)
    return i < len(points) and points[i] == n


@dataclass(frozen=True)
class StallRun:
    arm: str
    start: int
    end: int

    @property
    def passes(self) -> int:
        return self.end - self.start + 1

    def describe(self) -> str:
        count = f"{self.passes} pass" + ("" if self.passes == 1 else "es")
        return f"stall of {self.arm}: passes {self.start}–{self.end} ({count})"


class _ArmStalls:
    """One arm's stalls: disjoint (start, end) runs, sorted (one scanner made them)."""

    def __init__(self, ranges: Iterable[tuple[int, int]]) -> None:
        runs = sorted(set(ranges))
        self.starts = array("q", (start for start, _ in runs))
        self.ends = array("q", (end for _, end in runs))

    def run_at(self, n: int) -> int | None:
        i = bisect_right(self.starts, n) - 1
        return i if i >= 0 and n <= self.ends[i] else None


class Marks:
    """Sorted pass numbers of each kind of event, for next/previous jumps."""

    KINDS: Final = ("divergence", "stall", "error", "desync", "damage")

    def __init__(self) -> None:
        self.divergence = array("q")
        self.stall = array("q")  # stall onsets, every arm's
        self.error = array("q")
        self.desync = array("q")  # passes where this rank disagrees with the others of its group
        self.gap = array("q")  # each gap's row: its first lost pass, else the pass after it
        self.loss = array("q")  # passes after which the recorder dropped records (``loss`` records)
        self.damage = array("q")  # gaps and losses, one jump for both
        self.failed_alloc = array("q")  # passes after which a KV allocation failed (also errors)
        self.arms: tuple[str, ...] = ()  # arms whose stalls are marked, in band order
        self._stalls: dict[str, _ArmStalls] = {}

    def of(self, kind: str) -> array:
        return getattr(self, kind)

    def next(self, kind: str, current: int) -> int | None:
        points = self.of(kind)
        i = bisect_right(points, current)
        return points[i] if i < len(points) else None

    def previous(self, kind: str, current: int) -> int | None:
        points = self.of(kind)
        i = bisect_left(points, current)
        return points[i - 1] if i > 0 else None

    # --- stalls, per arm ---

    def set_stalls(self, by_arm: Mapping[str, Iterable[tuple[int, int]]]) -> None:
        self.arms = tuple(by_arm)
        self._stalls = {arm: _ArmStalls(ranges) for arm, ranges in by_arm.items()}
        self.stall = array("q", sorted({s for arm in self._stalls.values() for s in arm.starts}))

    def stall_runs(self, arm: str | None = None) -> list[StallRun]:
        """Every stall of ``arm`` (None: of every arm), by start."""
        runs = [StallRun(name, s, e) for name, stalls in self._stalls.items() if arm in (None, name)
                for s, e in zip(stalls.starts, stalls.ends)]
        return sorted(runs, key=lambda r: (r.start, self.arms.index(r.arm)))

    def stalls_at(self, n: int) -> list[StallRun]:
        """The stalls that hold pass ``n``, one per arm at most, in band order."""
        out = []
        for arm, stalls in self._stalls.items():
            i = stalls.run_at(n)
            if i is not None:
                out.append(StallRun(arm, stalls.starts[i], stalls.ends[i]))
        return out

    def stall_status(self, n: int) -> str:
        """Whose stalls pass ``n`` is in (those starting there first), and which arms have none there."""
        held = sorted(self.stalls_at(n), key=lambda run: run.start != n)
        parts = [run.describe() for run in held]
        others = [arm for arm in self.arms if arm not in {run.arm for run in held}]
        if others:
            parts.append(f"{', '.join(others)}: no stall here")
        return "; ".join(parts)

    def stalled_arms(self, n: int) -> tuple[bool, ...]:
        """For each arm in ``arms``: is pass ``n`` inside one of its stalls?"""
        return tuple(stalls.run_at(n) is not None for stalls in self._stalls.values())

    def in_stall(self, n: int) -> bool:
        return any(self.stalled_arms(n))

    # --- the rest ---

    def failed_alloc_at(self, n: int) -> bool:
        return _has(self.failed_alloc, n)

    def add_divergence(self, n: int) -> None:
        """A divergence the replay worker just found."""
        if not _has(self.divergence, n):
            insort(self.divergence, n)

    def is_divergence(self, n: int) -> bool:
        return _has(self.divergence, n)

    def is_desync(self, n: int) -> bool:
        return _has(self.desync, n)

    def kind_at(self, n: int) -> str | None:
        """The most serious kind of event at pass ``n`` (the order of ``GLYPHS``)."""
        for kind in POINT_KINDS:
            if _has(self.of(kind), n):
                return kind
        if self.in_stall(n):
            return "stall"
        return None


def _sorted(points: Iterable[int]) -> array:
    return array("q", sorted(set(points)))


def build_marks(scan: ScanResult | None, replay: ReplayIndex, *, desync: Iterable[int] = (),
                gaps: Iterable[int] = ()) -> Marks:
    """``desync``: this rank's passes where the ranks disagree; ``gaps``: each gap's pass-list row."""
    marks = Marks()
    marks.desync = _sorted(desync)
    marks.gap = _sorted(gaps)
    marks.loss = _sorted(loss.after for loss in scan.loss_events) if scan is not None else array("q")
    marks.damage = _sorted([*marks.gap, *marks.loss])
    marks.divergence = array("q", sorted(replay.divergences))
    if replay.report is not None:
        marks.set_stalls(replay.stall_runs())
    else:
        marks.set_stalls({RECORDED: scan.stalls if scan is not None else []})
    errors = set(replay.error_passes())
    if scan is not None:
        errors.update(scan.error_passes)
        marks.failed_alloc = array("q", sorted(set(scan.failed_allocs)))
    marks.error = array("q", sorted(errors))
    return marks
