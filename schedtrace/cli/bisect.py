"""``schedtrace bisect TRACE...``: onset, first divergence and smallest fix set of each stall, per rank.

Exit codes, as ``schedtrace replay --fail-on stall``: 0 no stock stall found,
1 at least one (on any rank), 2 usage or input error (one line on stderr, no
traceback; see schedtrace.cli). A trace with holes (unreadable regions, loss
records) is bisected over the passes present and its holes are listed; they
do not change the exit status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import (chosen_ranks, executor_for, from_pass_option, json_option, ray_options,
                                    stall_passes_option, damaged_traces_argument)
from schedtrace.cli.holes import print_holes
from schedtrace.cli.per_rank import exit_if_tripped, retry_note, write_reports
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural
from schedtrace.replay.bisect import CLOSED_LOOP, OPEN_LOOP, BisectReport, StallFinding
from schedtrace.tracer.contract.traceset import TraceSet

if TYPE_CHECKING:
    from rich.console import Console

MODES = {"both": (OPEN_LOOP, CLOSED_LOOP), OPEN_LOOP: (OPEN_LOOP,), CLOSED_LOOP: (CLOSED_LOOP,)}


def _divergence_text(finding: StallFinding) -> str:
    d = finding.first_divergence
    return "-" if d is None else f"{d.pass_} ({', '.join(d.kinds)})"


def _fix_text(finding: StallFinding) -> str:
    if not finding.reproduced:
        return "[yellow]not reproduced in closed loop[/]"
    if finding.fix_set is None:
        return f"[red]none of {plural(len(finding.tried), 'subset')}[/]"
    return "[green]" + " + ".join(finding.fix_set) + "[/]"


def render(report: BisectReport, console: Console) -> None:
    console.print(
        f"[bold]{report.trace}[/]: stock stalls of at least {plural(report.stall_passes, 'pass')}; "
        f"closed loop from pass {report.from_pass}; fixes searched: {', '.join(report.fixes)}"
    )
    if retry_note(report.retried_tasks):
        console.print(retry_note(report.retried_tasks))
    print_holes(report.holes, console)  # stalls are found over the passes present
    for mode, findings in ((OPEN_LOOP, report.open_loop), (CLOSED_LOOP, report.closed_loop)):
        if not findings:
            console.print(f"{mode}: no stock stall")
            continue
        table = compact_table(("stall", "passes", "head", "diverged at", "smallest fix set"),
                              shrink=("head",), title=f"{mode}: {plural(len(findings), 'stock stall')}")
        for f in findings:
            s = f.stall
            table.add_row(f"{s.start_pass}-{s.end_pass}", str(s.passes), s.head_rid or "-",
                          _divergence_text(f), _fix_text(f))
        console.print(table)


@click.command(short_help="Find where each stall began and the fewest fixes that remove it, per rank.")
@damaged_traces_argument
@stall_passes_option()
@json_option("the findings (several ranks: one report per rank)")
@from_pass_option
@click.option("--max-passes", type=click.IntRange(min=1), default=None,
              help="Bound every closed loop to this many passes (default: enough for every request to finish).")
@click.option("--mode", type=click.Choice(sorted(MODES)), default="both", show_default=True,
              help="Which stalls to bisect: open-loop (recorded passes), closed-loop, or both.")
@ray_options
def bisect(traces: TraceSet, rank: str | None, run_id: str | None, stall_passes: int, json_out: str | None,
           from_pass: int, max_passes: int | None, mode: str, use_ray: bool, address: str | None) -> None:
    """Find where each stock stall of each rank of TRACE... (files, globs or directories; a rank's
    parts read as one) began and the fewest fixes that remove it."""
    from schedtrace.replay.bisect import dump_bisect, run_bisect

    reports: dict[str, BisectReport] = {}
    with traces, Activity() as activity:
        run, ranks = chosen_ranks(traces, rank, run_id)
        # Locally one process, as before; on Ray the pass ranges and each size's fix subsets are tasks.
        with executor_for(use_ray, address, None, activity) as executor:
            activity.import_sglang()
            for r in ranks:
                which = f" on {r.label}" if len(ranks) > 1 else ""
                activity.phase(f"bisecting stalls ({mode}){which}")  # no per-pass progress from replay.bisect yet
                reports[r.label] = run_bisect(r, stall_passes=stall_passes, from_pass=from_pass,
                                              max_passes=max_passes, modes=MODES[mode],
                                              executor=executor if use_ray else None)
    write_reports(run, reports, json_out, dump_bisect, render)
    exit_if_tripped(reports, lambda report: bool(report.findings))
