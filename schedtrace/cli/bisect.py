"""``schedtrace bisect TRACE...``: onset, first divergence and smallest fix set of each stall, per rank.

Exit codes, as ``schedtrace replay --fail-on stall``: 0 no stock stall found,
1 at least one (on any rank), 2 usage or input error (one line on stderr, no
traceback; see schedtrace.cli). A trace with holes (unreadable regions, loss
records) is bisected over the passes present and its holes are listed; they
do not change the exit status.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import (VARIANT, chosen_ranks, executor_for, from_pass_option, json_option, ray_options,
                                    stall_passes_option, damaged_traces_argument)
from schedtrace.cli.holes import print_holes
from schedtrace.cli.per_rank import exit_if_tripped, retry_note, write_reports
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural
from schedtrace.replay.bisect import CLOSED_LOOP, OPEN_LOOP
from schedtrace.tracer.contract.report import BisectReport, StallFinding
from schedtrace.tracer.contract.traceset import TraceSet

if TYPE_CHECKING:
    from rich.console import Console

MODES = {"both": (OPEN_LOOP, CLOSED_LOOP), OPEN_LOOP: (OPEN_LOOP,), CLOSED_LOOP: (CLOSED_LOOP,)}


def _fix_text(finding: StallFinding) -> str:
    if not finding.reproduced:
        return "[yellow]not reproduced in closed loop[/]"
    if finding.fix_set is None:
        return f"[red]none of {plural(len(finding.tried), 'subset')}[/]"
    return "[green]" + " + ".join(finding.fix_set) + "[/]"


class RecordedPasses:
    """Closed-loop pass numbers as the recorded pass at the same scheduler pass of the pass clock.

    A closed loop numbers its steps ``from_pass + k`` counting every scheduler
    pass, idle ones included (docs/closed-loop.md), so its numbers run far past
    the recorded pass numbers; the recorded pass is the pass record at or
    before that step on the clock, which is the number the open-loop table uses.
    """

    def __init__(self, reader, from_pass: int) -> None:
        from schedtrace.replay.loop.run import scan_trace

        scan = scan_trace(reader)
        self._iterations = [iteration for iteration, _ in scan.points]
        self._numbers = scan.numbers
        self._first = reader.header.first_pass
        self._start = scan.iteration_of(from_pass)
        self._from = from_pass

    def __call__(self, loop_pass: int) -> int:
        if not self._numbers:
            return loop_pass
        at = bisect_right(self._iterations, self._start + loop_pass - self._from) - 1
        return self._first + self._numbers[max(at, 0)]


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _table(mode: str, findings: list[StallFinding], recorded: Callable[[int], int] | None):
    """One row per stall; a closed loop's at recorded pass numbers, its own loop step last."""
    number = recorded or (lambda n: n)
    columns = ("stall", "passes", "head", "diverged at", "smallest fix set") + (("loop step",) if recorded else ())
    table = compact_table(columns, shrink=("head",), title=f"{mode}: {plural(len(findings), 'stock stall')}")
    for f in findings:
        s, d = f.stall, f.first_divergence
        diverged = "-" if d is None else f"{number(d.pass_)} ({', '.join(d.kinds)})"
        step = (str(s.start_pass),) if recorded else ()
        table.add_row(_span(number(s.start_pass), number(s.end_pass)), str(s.passes), s.head_rid or "-",
                      diverged, _fix_text(f), *step)
    return table


def render(report: BisectReport, console: Console, *, modes: tuple[str, ...] = MODES["both"],
           recorded: Callable[[int], int] | None = None) -> None:
    """The findings of the modes that ran, every stall at its recorded pass numbers (a closed
    loop's through ``recorded``, with the loop step beside them, which ``repro --stall`` takes)."""
    console.print(
        f"[bold]{report.trace}[/]: stock stalls of at least {plural(report.stall_passes, 'pass')}"
        + (f"; closed loop from pass {report.from_pass}" if CLOSED_LOOP in modes else "")
        + f"; fixes searched: {', '.join(report.fixes)}"
    )
    if retry_note(report.retried_tasks):
        console.print(retry_note(report.retried_tasks))
    print_holes(report.holes, console)  # stalls are found over the passes present
    for mode, findings in ((OPEN_LOOP, report.open_loop), (CLOSED_LOOP, report.closed_loop)):
        if mode not in modes:
            continue
        if not findings:
            console.print(f"{mode}: no stock stall")
            continue
        loop = recorded if mode == CLOSED_LOOP else None
        console.print(_table(mode, findings, loop))
        if loop is not None:
            console.print("  loop step: the closed loop's count, idle passes too (repro --stall takes it)")


@click.command(short_help="Find where each stall began and the fewest fixes that remove it, per rank.")
@damaged_traces_argument
@stall_passes_option()
@json_option("the findings (several ranks: one report per rank)")
@from_pass_option
@click.option("--max-passes", type=click.IntRange(min=1), default=None,
              help="Bound every closed loop to this many passes (default: enough for every request to finish).")
@click.option("--mode", type=click.Choice(sorted(MODES)), default="both", show_default=True,
              help="Which stalls to bisect: open-loop (recorded passes), closed-loop, or both.")
@click.option("--fixes", type=VARIANT, default=None, metavar="LIST",
              help="The candidates the smallest fix set is searched among: fixes and arm files "
              "(.diff/.patch, edits .py), e.g. 'latch,./mine.diff' (default: the four fixes).")
@ray_options
def bisect(traces: TraceSet, rank: str | None, run_id: str | None, stall_passes: int, json_out: str | None,
           from_pass: int, max_passes: int | None, mode: str, fixes: str | None, use_ray: bool,
           address: str | None) -> None:
    """Find where each stock stall of each rank of TRACE... (files, globs or directories; a rank's
    parts read as one) began and the fewest fixes that remove it."""
    from schedtrace.replay.bisect import run_bisect
    from schedtrace.tracer.contract.report import dump_bisect

    reports: dict[str, BisectReport] = {}
    recorded: dict[str, RecordedPasses] = {}
    with traces, Activity() as activity:
        run, ranks = chosen_ranks(traces, rank, run_id)
        # Locally one process, as before; on Ray the pass ranges and each size's fix subsets are tasks.
        with executor_for(use_ray, address, None, activity) as executor:
            activity.import_sglang()
            for r in ranks:
                which = f" on {r.label}" if len(ranks) > 1 else ""
                activity.phase(f"bisecting stalls ({mode}){which}")  # no per-pass progress from replay.bisect yet
                reports[r.label] = run_bisect(r, stall_passes=stall_passes, from_pass=from_pass,
                                              max_passes=max_passes, modes=MODES[mode], fixes=fixes,
                                              executor=executor if use_ray else None)
                if reports[r.label].closed_loop:
                    recorded[reports[r.label].trace] = RecordedPasses(r, from_pass)
    write_reports(run, reports, json_out, dump_bisect,
                  lambda report, console: render(report, console, modes=MODES[mode],
                                                 recorded=recorded.get(report.trace)))
    exit_if_tripped(reports, lambda report: bool(report.findings))
