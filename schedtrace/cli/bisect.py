"""``schedtrace bisect TRACE``: onset, first divergence and smallest fix set of each stall.

Exit codes, as ``schedtrace replay --fail-on stall``: 0 no stock stall found,
1 at least one, 2 usage or input error (one line on stderr, no traceback;
schedtrace.cli turns SchedtraceError into that).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from schedtrace.replay.bisect import CLOSED_LOOP, OPEN_LOOP, BisectReport, StallFinding
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES

MODES = {"both": (OPEN_LOOP, CLOSED_LOOP), OPEN_LOOP: (OPEN_LOOP,), CLOSED_LOOP: (CLOSED_LOOP,)}


def _divergence_text(finding: StallFinding) -> str:
    d = finding.first_divergence
    return "-" if d is None else f"{d.pass_} ({', '.join(d.kinds)})"


def _fix_text(finding: StallFinding) -> str:
    if not finding.reproduced:
        return "[yellow]not reproduced in closed loop[/]"
    if finding.fix_set is None:
        return f"[red]none of {len(finding.tried)} subsets[/]"
    return "[green]" + " + ".join(finding.fix_set) + "[/]"


def render(report: BisectReport, console) -> None:
    from rich.table import Table

    console.print(
        f"[bold]{report.trace}[/]: stock stalls of at least {report.stall_passes} passes; "
        f"closed loop from pass {report.from_pass}; fixes searched: {', '.join(report.fixes)}"
    )
    for mode, findings in ((OPEN_LOOP, report.open_loop), (CLOSED_LOOP, report.closed_loop)):
        if not findings:
            console.print(f"{mode}: no stock stall")
            continue
        table = Table("onset", "end", "passes", "head", "first divergence", "smallest fix set",
                      title=f"{mode}: {len(findings)} stock stall{'s' if len(findings) != 1 else ''}")
        for f in findings:
            s = f.stall
            table.add_row(str(s.start_pass), str(s.end_pass), str(s.passes), s.head_rid or "-",
                          _divergence_text(f), _fix_text(f))
        console.print(table)


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--stall-passes", type=click.IntRange(min=1), default=DEFAULT_STALL_PASSES, show_default=True,
              help="Passes without admission (head request fits) that make a stall.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the findings as JSON.")
@click.option("--from", "from_pass", type=click.IntRange(min=0), default=0, show_default=True,
              help="Closed loop: start from this recorded pass.")
@click.option("--max-passes", type=click.IntRange(min=1), default=None,
              help="Bound every closed loop to this many passes (default: enough for every request to finish).")
@click.option("--mode", type=click.Choice(sorted(MODES)), default="both", show_default=True,
              help="Which stalls to bisect: open-loop (recorded passes), closed-loop, or both.")
def bisect(trace: Path, stall_passes: int, json_path: Path | None, from_pass: int,
           max_passes: int | None, mode: str) -> None:
    """Find where each stock stall of TRACE began and the fewest fixes that remove it."""
    from rich.console import Console

    from schedtrace.replay.bisect import dump_bisect, run_bisect

    report = run_bisect(trace, stall_passes=stall_passes, from_pass=from_pass, max_passes=max_passes, modes=MODES[mode])
    if json_path is not None:
        json_path.write_bytes(dump_bisect(report))
    render(report, Console())
    if report.findings:
        sys.exit(1)
