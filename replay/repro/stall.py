"""``schedtrace repro TRACE --stall K``: the smallest trace that still stalls, and its test.

K is a stall's onset as ``schedtrace bisect`` lists it (open-loop stalls
first, then closed-loop ones). Bisect gives the closed loop's start and the
smallest fix set that removes the stall. The minimal trace keeps the
recorded pass the loop starts from and the requests delta debugging over
them cannot drop: a trace of the kept requests must stall under stock in
closed loop and not stall at all under the fix set, every step checked by
running both closed loops (the real sglang code decides each pass).

The trace holds one pass record: arrivals are placed on the pass they
arrived at in the original loop (one pass per ``DEFAULT_PASS_NS``, the clock
of a trace with one pass), and each kept request's recorded output length
becomes a ``finish`` event. The emitted test runs schedtrace's closed loop
on it, under whatever ``SCHEDTRACE_FIXES`` applied, so it imports schedtrace.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgspec

from schedtrace.replay.bisect import OPEN_LOOP, run_bisect
from schedtrace.tracer.contract.report import StallFinding
from schedtrace.replay.loop.run import load_input, run_arms, scan_trace
from schedtrace.replay.driver import PassDriver
from schedtrace.replay.loop.clock import DEFAULT_PASS_NS
from schedtrace.replay.repro.ddmin import ddmin
from schedtrace.replay.repro.shrink import inputs_only
from schedtrace.arms.variants import parse_variant, variant_label
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.names import STOCK
from schedtrace.tracer.contract.schema import Arrival, Finish, Header, Pass


@dataclass(frozen=True)
class StallCase:
    """A stall to reproduce, and the requests of its closed loop."""

    trace: str
    header: Header
    finding: StallFinding
    fixes: str  # the fix set the test is for
    stall_passes: int
    start: Pass  # the recorded pass the closed loop starts from (its inputs)
    arrivals: list[tuple[int, Arrival]]  # (closed-loop step, arrival) of requests still to come
    targets: dict[str, int]  # rid -> recorded output length
    recorded_passes: int

    @property
    def rids(self) -> list[str]:
        """Every request of the loop: queued, running, chunked, then arriving."""
        s = self.start
        start = [r.rid for r in (*s.waiting, *s.running)] + ([s.chunked.rid] if s.chunked else [])
        return start + [a.rid for _, a in self.arrivals]


def find_stall(trace: str | os.PathLike[str], onset: int, *, stall_passes: int, fix: str | None = None) -> StallCase:
    """The stock stall starting at ``onset``, with bisect's closed-loop start and fix set."""
    report = run_bisect(trace, stall_passes=stall_passes)
    finding = next((f for f in report.findings if f.stall.start_pass == onset), None)
    if finding is None:
        onsets = ", ".join(str(n) for n in sorted({f.stall.start_pass for f in report.findings})) or "none"
        raise UsageError(f"--stall {onset}: no stock stall starts at pass {onset} (onsets: {onsets})")
    if not finding.reproduced:
        raise UsageError(f"--stall {onset}: stock does not stall there in closed loop, so no trace can show it")
    fixes = variant_label(parse_variant(fix)) if fix is not None else None
    if fixes is None and finding.fix_set is None:
        raise UsageError(f"--stall {onset}: no set of fixes removes this stall")
    fixes = fixes or variant_label(frozenset(finding.fix_set or ()))
    from_pass = onset if finding.mode == OPEN_LOOP else report.from_pass
    with TraceReader(trace) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, from_pass, scan)
    arrivals = [
        (step, Arrival(t_ns=0, rid=r.rid, input_len=r.input_len, max_new_tokens=r.max_new_tokens,
                       priority=r.priority, ignore_eos=r.ignore_eos))
        for step, r in loop.arrivals
    ]
    return StallCase(str(trace), loop.header, finding, fixes, stall_passes, inputs_only(loop.start), arrivals,
                     scan.targets, loop.recorded_passes)


def minimal_records(case: StallCase, keep: list[str]) -> list:
    """The records of a one-pass trace holding only the requests ``keep``."""
    kept = set(keep)
    s = case.start
    start = msgspec.structs.replace(
        s, seq=0, t_ns=0,
        waiting=[w for w in s.waiting if w.rid in kept],
        running=[r for r in s.running if r.rid in kept],
        chunked=s.chunked if s.chunked is not None and s.chunked.rid in kept else None,
        candidates=[c for c in s.candidates if c.rid in kept],
    )
    arrivals = [msgspec.structs.replace(a, t_ns=step * DEFAULT_PASS_NS) for step, a in case.arrivals if a.rid in kept]
    end = (max((step for step, _ in case.arrivals), default=0) + 1) * DEFAULT_PASS_NS
    finishes = [Finish(t_ns=end, rid=rid, output_len=case.targets[rid], reason="length")
                for rid in keep if rid in case.targets]
    return [start, *arrivals, *finishes]


def write_minimal(case: StallCase, keep: list[str], path: Path) -> Path:
    header = msgspec.structs.replace(case.header, part=0, first_pass=0)
    return write_trace(path, header, minimal_records(case, keep))


def stalls(path: Path, variant: str, stall_passes: int, driver: PassDriver) -> list:
    """The closed-loop stalls of ``variant`` on the trace at ``path``, from its first pass."""
    return run_arms(path, [variant], stall_passes=stall_passes, driver=driver)[variant].stalls


@dataclass(frozen=True)
class MinimalTrace:
    keep: list[str]
    closed_loops: int  # closed loops run to find it (two per probe)


def minimize(case: StallCase) -> MinimalTrace:
    """The fewest requests that stall under stock and not under the fix set (ddmin over the requests)."""
    driver = PassDriver(case.header)
    runs = 0
    seen: dict[tuple[str, ...], bool] = {}
    with tempfile.TemporaryDirectory(prefix="schedtrace-stall-") as tmp:
        probe_path = Path(tmp) / "probe.trace"

        def holds(keep: list[str]) -> bool:
            nonlocal runs
            key = tuple(keep)
            if key not in seen:
                write_minimal(case, keep, probe_path)
                runs += 1
                seen[key] = bool(stalls(probe_path, STOCK, case.stall_passes, driver))
                if seen[key]:
                    runs += 1
                    seen[key] = not stalls(probe_path, case.fixes, case.stall_passes, driver)
            return seen[key]

        everything = case.rids
        if not holds(everything):
            raise UsageError(
                f"--stall {case.finding.stall.start_pass}: a trace of its closed loop does not stall under stock "
                f"and run clean under {case.fixes}, so there is nothing to shrink"
            )
        keep = ddmin(everything, holds)
    return MinimalTrace(keep, runs)


def describe_stall(case: StallCase, found: MinimalTrace) -> str:
    return (f"{len(case.rids)} requests, {case.recorded_passes} passes → "
            f"{len(found.keep)} request{'s' * (len(found.keep) != 1)}, 1 pass")


def predict_stall(path: Path, case: StallCase, variants: list[str]) -> dict[str, bool]:
    """Per variant, whether the emitted test passes: no closed-loop stall on the minimal trace."""
    driver = PassDriver(case.header)
    return {v: not stalls(path, v, case.stall_passes, driver) for v in variants}


def emit_stall_module(case: StallCase, found: MinimalTrace, trace_name: str) -> str:
    """The text of the closed-loop test for the minimal trace ``trace_name`` beside it."""
    from schedtrace.arms.patching import sglang_version
    from schedtrace.replay.repro.emit import lit, paragraph

    s = case.finding.stall
    version = sglang_version()
    lines = [f"Closed loop: stock sglang stalls the waiting queue; the {case.fixes} fix removes the stall.", ""]
    lines += paragraph(
        f"Found by schedtrace in {case.trace}: an {case.finding.mode} stock stall from pass {s.start_pass}"
        f" to {s.end_pass} ({s.passes} passes, head request {s.head_rid}); `schedtrace bisect` names"
        f" {case.fixes} as the smallest set of fixes that removes it. Delta debugging over the"
        f" requests of its closed loop ({describe_stall(case, found)}) kept {', '.join(found.keep)}:"
        f" {trace_name} beside this file, which still stalls under stock and does not under"
        f" {case.fixes}, every step checked by running both closed loops."
    )
    lines += paragraph(
        "This test imports schedtrace: its closed-loop replay evolves the scheduler state pass by"
        " pass, and the real sglang scheduler code decides every pass. It runs under the fixes"
        f" SCHEDTRACE_FIXES applied (schedtrace's pytest plugin). Fails on sglang {version} as"
        f" released; passes with `SCHEDTRACE_FIXES={case.fixes} python -m pytest`. Runs on CPU."
    )
    docstring = '"""' + "\n".join(lines).rstrip() + '\n"""'
    return "\n".join([
        docstring,
        "",
        "from __future__ import annotations",
        "",
        "from pathlib import Path",
        "",
        "from schedtrace.replay.loop.run import run_closed_loop",
        "from schedtrace.arms.variants import active_fixes, variant_label",
        "",
        f"TRACE = Path(__file__).with_name({lit(trace_name)})",
        f"STALL_PASSES = {case.stall_passes}  # a stall: this many passes admitting nothing while the head fits",
        "",
        "",
        "def test_waiting_queue_does_not_stall_in_closed_loop():",
        '    """Every pass decided by the real scheduler, each arm living with its own decisions."""',
        "    arm = variant_label(active_fixes())  # stock, or the fixes SCHEDTRACE_FIXES applied",
        "    outcome = run_closed_loop(TRACE, [arm], stall_passes=STALL_PASSES).arms[arm]",
        "    assert not outcome.stall_runs, (",
        '        f"under {arm} the queue stalled: {outcome.stall_runs}; "',
        '        "requests wait with a slot free and the head fitting in free + evictable KV"',
        "    )",
        "",
    ])
