"""The closed loop's self-check: how closely the stock arm reproduces the recording.

Open-loop replay checks every recorded decision (fidelity); a closed loop
decides on states it evolved itself, so it is checked on outcomes instead:
the stock arm, run from the recorded start, against what the recording
shows after it (``TraceScan``):

* each request's wait from arrival (or the start) to its first admission,
  in scheduler passes on both sides: the loop counts its steps, the
  recording the pass clock (pass records, their folded repeats, idle
  passes). Per request the error ``|loop - recorded| / max(recorded, typical)``,
  ``typical`` being the median recorded wait over those requests (at least 1):
  a request that waited less than most is judged on the trace's own scale,
  so one pass more on a three-pass wait is not 33% when waits run to
  eighty passes; its median and 90th percentile over the requests admitted in both;
* the queue peak: the longest waiting queue at a pass entry;
* the completion order of the requests finished in both: the fraction of
  pairs in the same order, and Kendall's tau-b.

Pure: the recording's side comes from the scan, the loop's from the arm's
outcome. Quantiles are nearest-rank, so every figure is one of the values.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from schedtrace.replay.loop.input import LoopInput
from schedtrace.replay.loop.scan import TraceScan
from schedtrace.tracer.contract.names import STOCK
from schedtrace.tracer.contract.report import ArmOutcome, SelfCheck

DIGITS = 6  # floats in the report: enough to see 0.1% changes, few enough to read


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: the smallest value with at least ``q`` of them at or below it (0: none)."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(math.ceil(q * len(ordered)), 1)
    return ordered[min(rank, len(ordered)) - 1]


def _pairs(counts: Counter) -> int:
    return sum(n * (n - 1) // 2 for n in counts.values())


def _strict_inversions(values: list[int]) -> int:
    """Pairs i < j with values[i] > values[j] (merge sort, O(n log n))."""
    inversions = 0
    width = 1
    items = list(values)
    while width < len(items):
        merged: list[int] = []
        for lo in range(0, len(items), 2 * width):
            left, right = items[lo:lo + width], items[lo + width:lo + 2 * width]
            i = j = 0
            while i < len(left) and j < len(right):
                if right[j] < left[i]:
                    inversions += len(left) - i  # right[j] is below every left value still unmerged
                    merged.append(right[j])
                    j += 1
                else:
                    merged.append(left[i])
                    i += 1
            merged += left[i:] + right[j:]
        items = merged
        width *= 2
    return inversions


def concordance(xs: Sequence[int], ys: Sequence[int]) -> tuple[float, float]:
    """(fraction of pairs strictly ordered on both sides that agree, Kendall's tau-b).

    Knight's algorithm: sort by (x, y); discordant pairs are the strict
    inversions of y. With no pair ordered on both sides both are 1.0:
    nothing disagrees.
    """
    n = len(xs)
    pairs = sorted(zip(xs, ys))
    total = n * (n - 1) // 2
    tied_x = _pairs(Counter(x for x, _ in pairs))
    tied_y = _pairs(Counter(y for _, y in pairs))
    tied_both = _pairs(Counter(pairs))
    discordant = _strict_inversions([y for _, y in pairs])
    concordant = total - tied_x - tied_y + tied_both - discordant
    ordered = concordant + discordant
    agreement = concordant / ordered if ordered else 1.0
    denominator = math.sqrt((total - tied_x) * (total - tied_y))
    tau = (concordant - discordant) / denominator if denominator else 1.0
    return agreement, tau


def recorded_waits(loop: LoopInput, scan: TraceScan) -> dict[str, int]:
    """rid -> passes from its arrival (or the start) to its first admission in the recording.

    Only requests the loop sees arrive (queued at the start or arriving
    after it), on the loop's own arrival steps, so both sides count alike.
    """
    arrived = {r.rid: 0 for r in loop.initial.waiting}
    arrived.update((r.rid, step) for step, r in loop.arrivals)
    waits: dict[str, int] = {}
    for rid, step in arrived.items():
        pass_no = scan.admitted_at.get(rid)
        if pass_no is None or pass_no < loop.from_pass:  # a pass number of the scan's own points
            continue
        waits[rid] = max(scan.iteration_of(pass_no) - loop.start_iteration - step, 0)
    return waits


def recorded_finish_steps(loop: LoopInput, scan: TraceScan) -> dict[str, int]:
    """rid -> loop step of its recorded finish, for requests the loop holds (and finishing after the start)."""
    rids = {r.rid for r in loop.initial.requests()} | {r.rid for _, r in loop.arrivals}
    return {
        rid: scan.clock.iteration_at(t_ns) - loop.start_iteration
        for rid, t_ns in scan.finished_ns.items()
        if rid in rids and t_ns > loop.start.t_ns
    }


def self_check(
    loop: LoopInput, scan: TraceScan, outcome: ArmOutcome, finished_at: dict[str, int], arm: str = STOCK
) -> SelfCheck:
    """``arm``'s closed loop from ``loop`` against the recording ``scan`` read."""
    recorded = recorded_waits(loop, scan)
    # A request first admitted before the start waits there requeued: its next admission is no first.
    looped = {rid: wait for rid, wait in outcome.first_admission_passes.items()
              if scan.admitted_at.get(rid, loop.from_pass) >= loop.from_pass}
    both = sorted(set(recorded) & set(looped))
    rec_waits = [recorded[rid] for rid in both]
    typical = max(int(quantile(rec_waits, 0.5)), 1) if rec_waits else 1
    errors = [abs(looped[rid] - recorded[rid]) / max(recorded[rid], typical) for rid in both]
    loop_waits = [looped[rid] for rid in both]
    rec_finish = recorded_finish_steps(loop, scan)
    finished = sorted(set(rec_finish) & set(finished_at))
    agreement, tau = concordance([rec_finish[r] for r in finished], [finished_at[r] for r in finished])
    return SelfCheck(
        arm=arm,
        requests=len(both),
        wait_error_p50=round(quantile(errors, 0.5), DIGITS),
        wait_error_p90=round(quantile(errors, 0.9), DIGITS),
        recorded_wait_p50=int(quantile(rec_waits, 0.5)),
        loop_wait_p50=int(quantile(loop_waits, 0.5)),
        recorded_wait_p90=int(quantile(rec_waits, 0.9)),
        loop_wait_p90=int(quantile(loop_waits, 0.9)),
        recorded_queue_peak=max(scan.queue_lengths[scan.position(loop.from_pass):], default=0),
        loop_queue_peak=outcome.queue_peak,
        finished=len(finished),
        order_agreement=round(agreement, DIGITS),
        kendall_tau=round(tau, DIGITS),
        recorded_only=len(set(recorded) - set(looped)),
        loop_only=len(set(looped) - set(recorded)),
    )


# ------------------------------------------------------------------ text


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def self_check_lines(check: SelfCheck) -> list[str]:
    """The self-check for a terminal, each line under 80 columns."""
    lines = [
        f"self-check: {check.arm} closed loop vs the recording (waits in passes)",
        f"  first-admission wait error: p50 {_percent(check.wait_error_p50)}, "
        f"p90 {_percent(check.wait_error_p90)} over {check.requests} requests",
        f"  wait p50 {check.recorded_wait_p50} recorded, {check.loop_wait_p50} loop; "
        f"p90 {check.recorded_wait_p90} recorded, {check.loop_wait_p90} loop",
        f"  queue peak {check.recorded_queue_peak} recorded, {check.loop_queue_peak} loop; "
        f"completion order: {_percent(check.order_agreement)} of pairs agree",
    ]
    if check.recorded_only or check.loop_only:
        lines.append(f"  admitted only in the recording: {check.recorded_only}; only in the loop: {check.loop_only}")
    return lines


def self_check_summary(check: SelfCheck) -> str:
    """One line: the figures a what-if should be read against. Requests admitted on one side only
    are named, since the wait error covers only those admitted on both."""
    one_sided = check.recorded_only + check.loop_only
    return (
        f"self-check ({check.arm}, recorded config): wait error p50 {_percent(check.wait_error_p50)}, "
        f"p90 {_percent(check.wait_error_p90)} over {check.requests} requests"
        + (f" ({check.recorded_only} admitted only in the recording, {check.loop_only} only in the loop)"
           if one_sided else "")
        + f"; queue peak {check.recorded_queue_peak} recorded, "
        f"{check.loop_queue_peak} loop; completion order {_percent(check.order_agreement)} of pairs"
    )
