"""Stall bisect: where each stock stall begins, where the fixed logic first
decides otherwise on the way there, and the smallest set of fixes that
removes it.

Stalls come from two places:

* ``open-loop``: stock replayed on the recorded passes (``schedtrace.replay.engine``);
  the onset is a recorded pass number;
* ``closed-loop``: stock living with its own decisions from ``from_pass``
  (``schedtrace.replay.loop.run``); the onset is a closed-loop pass number.

For each stall:

* ``first_divergence``: the first pass, after the previous stall of the same
  kind ended and no later than the onset, where stock and fixed decide
  differently on the same state (open loop: the recorded passes; closed
  loop: the passes stock went through);
* ``fix_set``: the smallest set of fixes that removes the stall in
  closed-loop replay. The 15 non-empty subsets of the four fixes are tried
  smallest first, ties in name order; a subset removes the stall when its
  closed loop, started where stock's was, has no stall overlapping the
  passes stock stalled on. An open-loop stall is re-run in closed loop from
  its onset; if stock does not stall there too the stall is marked
  ``reproduced: false`` and no fix set is searched.

The trace is a file or a ``RankTrace`` (one rank's parts read as one); a
file is read past its unreadable regions, and ``holes`` lists them and the
``loss`` records (``tracer.analysis.holes``), as the replay report does.

Deterministic: the same trace and options give the same report bytes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Final

from schedtrace.replay.loop.run import ArmRun, LoopInput, TraceScan, load_input, run_arm, scan_trace
from schedtrace.replay.differ import divergence_kinds
from schedtrace.replay.scale.executor import Executor
from schedtrace.tracer.analysis.holes import scan_holes
from schedtrace.tracer.contract.report import BisectReport, Decision, FirstDivergence, Stall, StallFinding
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, FIXED, STOCK
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.traceset import RankTrace

TraceSource = str | os.PathLike[str] | RankTrace

OPEN_LOOP: Final = "open-loop"
CLOSED_LOOP: Final = "closed-loop"


def fix_subsets(fixes: list[str]) -> list[tuple[str, ...]]:
    """Every non-empty subset, smallest first, ties in name order."""
    names = sorted(fixes)
    return [combo for size in range(1, len(names) + 1) for combo in itertools.combinations(names, size)]


# ------------------------------------------------------------------ search


class _ClosedLoops:
    """Closed-loop runs of one start pass keyed by (start, variant, bound), each run once."""

    def __init__(self, reader: TraceReader | RankTrace, driver, stall_passes: int, max_passes: int | None,
                 executor: Executor | None = None) -> None:
        self.reader = reader
        self.executor = executor  # None: fix subsets one after the other, here
        self.driver = driver
        self.stall_passes = stall_passes
        self.max_passes = max_passes
        self._scan: TraceScan | None = None
        self._inputs: dict[int, LoopInput] = {}
        self._runs: dict[tuple[int, str, int | None], ArmRun] = {}

    def loop_input(self, from_pass: int) -> LoopInput:
        if self._scan is None:
            self._scan = scan_trace(self.reader)
        if from_pass not in self._inputs:
            self._inputs[from_pass] = load_input(self.reader, from_pass, self._scan)
        return self._inputs[from_pass]

    def run(self, from_pass: int, variant: str, horizon: int | None = None) -> ArmRun:
        bound = self.max_passes if horizon is None else min(horizon, self.max_passes or horizon)
        key = (from_pass, variant, bound)
        if any(k[0] != from_pass for k in self._runs):
            self._runs.clear()  # stalls are searched one start at a time: keep memory flat
        if key not in self._runs:
            self._runs[key] = run_arm(
                self.loop_input(from_pass), self.driver, variant, stall_passes=self.stall_passes, max_passes=bound
            )
        return self._runs[key]


def _subset_clears(task: tuple[LoopInput, str, int, int | None, int, int]) -> bool:
    """One fix subset's closed loop (in a worker): whether it has no stall overlapping the target."""
    from schedtrace.replay.driver import PassDriver

    loop, variant, stall_passes, bound, start, end = task
    run = run_arm(loop, PassDriver(loop.header), variant, stall_passes=stall_passes, max_passes=bound)
    return run.stall_overlapping(start, end) is None


def _smallest_on(executor: Executor, loops: _ClosedLoops, from_pass: int, target: Stall, fixes: list[str],
                 horizon: int) -> tuple[list[str] | None, list[str]]:
    """``smallest_fix_set`` with each size's subsets run at once on ``executor``: same answer, same order."""
    loop = loops.loop_input(from_pass)
    bound = min(horizon, loops.max_passes or horizon)
    tried: list[str] = []
    for size in range(1, len(fixes) + 1):
        subsets = [s for s in fix_subsets(fixes) if len(s) == size]
        tasks = [(loop, ",".join(s), loops.stall_passes, bound, target.start_pass, target.end_pass) for s in subsets]
        for subset, clears in zip(subsets, executor.map(_subset_clears, tasks)):
            tried.append(",".join(subset))
            if clears:
                return list(subset), tried
    return None, tried


def smallest_fix_set(
    loops: _ClosedLoops, from_pass: int, target: Stall, fixes: list[str], last_end: int | None = None
) -> tuple[list[str] | None, list[str]]:
    """The first subset whose closed loop has no stall overlapping ``target``.

    A stall overlapping the target starts by its end and is a stall N passes
    later: no run need go further. ``last_end`` (the end of the last stall to
    be searched from the same start) lets one run per subset serve them all.
    With ``loops.executor``, the subsets of one size run as parallel tasks.
    """
    horizon = max(target.end_pass, last_end or 0) - from_pass + loops.stall_passes + 1
    if loops.executor is not None:
        return _smallest_on(loops.executor, loops, from_pass, target, fixes, horizon)
    tried: list[str] = []
    for subset in fix_subsets(fixes):
        variant = ",".join(subset)
        tried.append(variant)
        run = loops.run(from_pass, variant, horizon)
        if run.stall_overlapping(target.start_pass, target.end_pass) is None:
            return list(subset), tried
    return None, tried


def first_divergence(steps: Iterator[tuple[int, Decision, Callable[[], Decision]]]) -> FirstDivergence | None:
    """The first (pass, stock decision, fixed decision) where the arms differ.

    The fixed decision is a callable so that passes after the first divergence
    are never decided.
    """
    for seq, old, fixed in steps:
        new = fixed()
        kinds = divergence_kinds(old, new)
        if kinds:
            return FirstDivergence(pass_=seq, kinds=kinds, stock=old, fixed=new)
    return None


def _windows(stalls: list[Stall]) -> list[tuple[int | None, Stall]]:
    """(first pass after the previous stall, stall) for each stall."""
    out, after = [], None
    for stall in stalls:
        out.append((after, stall))
        after = stall.end_pass + 1
    return out


def _open_loop_findings(path: TraceSource, loops: _ClosedLoops, fixes: list[str], new: str = FIXED) -> list[StallFinding]:
    from schedtrace.replay.engine import replay_trace

    report = replay_trace(path, STOCK, new, stall_passes=loops.stall_passes, executor=loops.executor)
    divergences = sorted(report.divergences, key=lambda d: d.pass_)
    findings = []
    for after, stall in _windows(report.stalls.get(STOCK, [])):
        lo = after if after is not None else -1
        first = next((d for d in divergences if lo <= d.pass_ <= stall.start_pass), None)
        diverged = (
            FirstDivergence(pass_=first.pass_, kinds=first.kinds, stock=first.old, fixed=first.new)
            if first is not None
            else None
        )
        # Long enough to see the stall again, and to see it go on as long as recorded.
        horizon = stall.passes + 2 * loops.stall_passes + 1
        target = loops.run(stall.start_pass, STOCK, horizon).stall_overlapping(stall.start_pass, stall.start_pass)
        reproduced = target is not None
        fix_set, tried = (None, [])
        if target is not None:
            fix_set, tried = smallest_fix_set(loops, stall.start_pass, target, fixes)
        findings.append(
            StallFinding(
                mode=OPEN_LOOP, stall=stall, first_divergence=diverged,
                reproduced=reproduced, fix_set=fix_set, tried=tried,
            )
        )
    return findings


def _closed_loop_findings(loops: _ClosedLoops, from_pass: int, fixes: list[str], new: str = FIXED) -> list[StallFinding]:
    stock_run = loops.run(from_pass, STOCK)
    findings = []
    last_end = stock_run.stalls[-1].end_pass if stock_run.stalls else None
    for after, stall in _windows(stock_run.stalls):
        lo = from_pass if after is None else after
        steps = (
            (p.seq, d, lambda p=p: loops.driver.decide(p, new))
            for p, d in zip(stock_run.passes, stock_run.decisions)
            if lo <= p.seq <= stall.start_pass
        )
        diverged = first_divergence(steps)
        fix_set, tried = smallest_fix_set(loops, from_pass, stall, fixes, last_end)
        findings.append(
            StallFinding(
                mode=CLOSED_LOOP, stall=stall, first_divergence=diverged,
                reproduced=True, fix_set=fix_set, tried=tried,
            )
        )
    return findings


def run_bisect(
    path: TraceSource,
    *,
    stall_passes: int = DEFAULT_STALL_PASSES,
    from_pass: int = 0,
    max_passes: int | None = None,
    modes: tuple[str, ...] = (OPEN_LOOP, CLOSED_LOOP),
    executor: Executor | None = None,
    fixes: str | None = None,
) -> BisectReport:
    """Bisect every stock stall of the trace at ``path`` (a file or a rank's parts); with
    ``executor``, the open-loop pass ranges and each size's fix subsets run as its tasks.

    ``fixes``: the candidates searched, a variant (fixes and user arm files; default ``fixed``,
    the four); the first divergence is where stock and all of them together first differ."""
    from schedtrace.replay.driver import PassDriver
    from schedtrace.replay.engine import check_variants, opened
    from schedtrace.arms.fixes import FIX_NAMES
    from schedtrace.arms.patching import sglang_version

    if stall_passes < 1:
        raise UsageError("--stall-passes must be at least 1")
    if max_passes is not None and max_passes < 1:
        raise UsageError("--max-passes must be at least 1")
    from schedtrace.arms.variants import parse_variant, variant_label

    members = parse_variant(fixes or FIXED)  # refuses candidates that change one function twice
    new = variant_label(members)
    fixes = sorted(members) if fixes else sorted(FIX_NAMES)
    check_variants(STOCK, new)
    with opened(path) as reader:
        loops = _ClosedLoops(reader, PassDriver(reader.header), stall_passes, max_passes, executor)
        retried = executor.retried if executor is not None else 0
        open_findings = _open_loop_findings(path, loops, fixes, new) if OPEN_LOOP in modes else []
        closed_findings = _closed_loop_findings(loops, from_pass, fixes, new) if CLOSED_LOOP in modes else []
        trace_version = reader.header.sglang_version
        name = reader.path
        holes = scan_holes(reader)
    return BisectReport(
        trace=name,
        sglang_version=sglang_version(),
        trace_sglang_version=trace_version,
        stall_passes=stall_passes,
        from_pass=from_pass,
        fixes=fixes,
        open_loop=open_findings,
        closed_loop=closed_findings,
        holes=holes,
        retried_tasks=executor.retried - retried if executor is not None else 0,
    )
