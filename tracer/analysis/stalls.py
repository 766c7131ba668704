"""Pure stall detection over passes and the decisions an arm made on them.

A stall is a run of at least ``min_passes`` consecutive passes where requests
wait, this arm admits nothing (no new request, no continuing chunk), and
sglang's own admission check would: under the fixed logic the next waiting
request gets a request slot and fits the budget, or the continuing chunk
runs. The check is ``schedtrace.tracer.analysis.admission.head_check``, a
mirror of ``PrefillAdder``'s arithmetic (strict bound, page rounding, the
per-request page, the running requests' decode reservation, the SWA pool's
budget beside the full pool's), held to the real code by
tests/test_stall_rule.py and tests/test_stall_rule_hybrid.py; a pass the
real check refuses is back-pressure, not a stall. Where the check is an
estimate (``HeadCheck.estimate``), ``StallScanner.estimates`` counts the
passes it judged so, by reason. Folded records count ``repeat`` passes; idle
passes between records (nothing waiting), and pass numbers missing between
two records (a trace's unreadable region), end a run.

The trace's ``Header`` gives the check the server's configuration; callers
that pass only ``max_running_requests`` (an int, or None) get page size 1,
fcfs and no mixed chunk, which the check reports as an estimate.

This is the one definition: replay, closed loop, bisect, ``info``, the TUI and
the exporters all use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

from schedtrace.tracer.analysis.admission import HeadCheck, ServerConfig, head_check
from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Decision, Stall
from schedtrace.tracer.contract.schema import Pass

# The rule in words, as every command's --help, ``info`` and the docs say it: a stall is a run of
# at least --stall-passes passes (folded repeats counted) where this holds.
STALL_RULE: Final = ("requests wait and nothing is admitted (no request, no chunk), although a request slot "
                     "is free and the head request fits in free + evictable KV minus the running requests' "
                     "decode reservation (sglang's own admission check)")


def _fixed_check(p: Pass, config: ServerConfig) -> HeadCheck | None:
    """The fixed logic's check of ``p`` (None: nothing waiting and no chunk to run)."""
    if not p.waiting and p.chunked is None:
        return None
    return head_check(p, config)


def _admits(check: HeadCheck | None) -> bool:
    return check is not None and (check.admits or check.chunk is not None)


def _got_in(d: Decision) -> bool:
    return bool(d.admitted) or d.chunk_size is not None


def _stall_check(p: Pass, d: Decision, config: ServerConfig) -> HeadCheck | None:
    """The check that decides whether ``d`` stalled on ``p`` (None: it got something in)."""
    if _got_in(d):
        return None
    return _fixed_check(p, config)


def is_stalled(p: Pass, d: Decision, config: ServerConfig = None) -> bool:
    """Requests wait, sglang's own check would admit, and this arm got nothing in."""
    return _admits(_stall_check(p, d, config))


def both_stalled(p: Pass, old: Decision, new: Decision, config: ServerConfig = None) -> tuple[bool, bool]:
    """``is_stalled`` for two arms' decisions on one pass, checking the pass once."""
    idle_old, idle_new = not _got_in(old), not _got_in(new)
    admits = _admits(_fixed_check(p, config)) if idle_old or idle_new else False
    return idle_old and admits, idle_new and admits


class StallScanner:
    """Incremental ``find_stalls``: feed passes in order, then ``finish``."""

    def __init__(self, min_passes: int, config: ServerConfig = None) -> None:
        if min_passes < 1:
            raise ValueError("min_passes must be at least 1")
        self.min_passes = min_passes
        self.config = config
        self.stalls: list[Stall] = []
        self.estimates: Counter[str] = Counter()  # passes judged on an estimate, by reason
        self._start: int | None = None
        self._end = 0
        self._count = 0
        self._head: str | None = None

    @property
    def open_run_start(self) -> int | None:
        """First pass of the stalled run in progress, if any."""
        return self._start

    def feed_pass(self, p: Pass, d: Decision, seq: int | None = None) -> bool:
        """Feed one pass under one arm's decision; returns whether it stalled."""
        check = _stall_check(p, d, self.config)
        stalled = _admits(check)
        for note in check.estimate if check is not None else ():
            self.estimates[note] += max(p.repeat, 1)
        head = p.waiting[0].rid if p.waiting else None
        self.feed(p.seq if seq is None else seq, p.repeat, p.idle_before, stalled, head)
        return stalled

    def feed(self, seq: int, repeat: int, idle_before: int, stalled: bool, head_rid: str | None) -> None:
        # A pass number skipped (lost in an unreadable region) ends a run too: no stall is
        # claimed across passes nobody saw.
        if self._start is not None and (idle_before > 0 or not stalled or seq != self._end + 1):
            self._close()
        if not stalled:
            return
        if self._start is None:
            self._start, self._count, self._head = seq, 0, head_rid
        self._end = seq
        self._count += max(repeat, 1)

    def _close(self) -> None:
        if self._start is not None and self._count >= self.min_passes:
            self.stalls.append(
                Stall(start_pass=self._start, end_pass=self._end, passes=self._count, head_rid=self._head)
            )
        self._start = None

    def finish(self) -> list[Stall]:
        self._close()
        return self.stalls


def find_stalls(
    passes: Sequence[Pass],
    decisions: Sequence[Decision],
    min_passes: int,
    config: ServerConfig = None,
) -> list[Stall]:
    """Stalls of one arm; ``decisions[i]`` is the arm's decision on ``passes[i]``."""
    if len(passes) != len(decisions):
        raise ValueError(f"{len(passes)} passes but {len(decisions)} decisions")
    scanner = StallScanner(min_passes, config)
    for p, d in zip(passes, decisions):
        scanner.feed_pass(p, d)
    return scanner.finish()


def recorded_stalls(passes: Iterable[Pass], min_passes: int, config: ServerConfig = None) -> list[Stall]:
    """Stalls in what the recording itself decided."""
    scanner = StallScanner(min_passes, config)
    for p in passes:
        scanner.feed_pass(p, recorded_decision(p))
    return scanner.finish()
