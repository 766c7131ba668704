"""``schedtrace replay TRACE``: open-loop replay under two arms, gated for CI.

Exit codes: 0 the gate holds, 1 ``--fail-on`` tripped, 2 usage or input
error (one line on stderr, no traceback; schedtrace.cli turns SchedtraceError
into that).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from schedtrace.tracer.contract.report import Report
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES

FAIL_ON = ("none", "divergence", "stall", "error")
PROGRESS_MIN_PASSES = 500  # show a progress bar only on traces at least this long
# Two workers beat one on long traces even on 2 shared cores (bench/bench_replay.py);
# the engine uses one process below 2 * MIN_PASSES_PER_JOB pass records anyway.
DEFAULT_JOBS = min(2, os.cpu_count() or 1)


def gate_tripped(report: Report, fail_on: str) -> bool:
    """Whether the report trips ``--fail-on``."""
    if fail_on == "divergence":
        return bool(report.divergences)
    if fail_on == "stall":
        return bool(report.stalls.get(report.new))
    if fail_on == "error":
        return bool(report.errors.get(report.new))
    return False


def _summary(report: Report, console) -> None:
    from rich.table import Table

    fid = report.fidelity
    console.print(f"[bold]{report.trace}[/]: {report.passes} passes, {report.aiter_events} aiter events, "
                  f"{report.old} vs {report.new}")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if report.unknown_records:
        skipped = ", ".join(f"{tag}={n}" for tag, n in report.unknown_records.items())
        console.print(f"[yellow]skipped unknown records:[/] {skipped}")
    if report.old == "stock":
        style = "green" if fid.matched == fid.total else "red"
        console.print(f"fidelity ({fid.arm} vs recording): [{style}]{fid.matched}/{fid.total}[/]")
        for m in fid.mismatches[:10]:
            console.print(f"  pass {m.pass_}: {', '.join(m.fields)}")
        if len(fid.mismatches) > 10:
            console.print(f"  ... {len(fid.mismatches) - 10} more")
    table = Table("kind", "passes", "fixes", title=f"divergences: {len(report.divergences)}")
    by_kind: dict[str, list] = {}
    for d in report.divergences:
        for kind in d.kinds:
            by_kind.setdefault(kind, []).append(d)
    for kind, items in by_kind.items():
        fixes = sorted({f for d in items for f in d.fixes})
        first = ", ".join(str(d.pass_) for d in items[:5]) + (" ..." if len(items) > 5 else "")
        table.add_row(kind, f"{len(items)} ({first})", ", ".join(fixes) or "-")
    if report.divergences:
        console.print(table)
    else:
        console.print("divergences: 0")
    for arm in dict.fromkeys((report.old, report.new)):
        stalls = report.stalls.get(arm, [])
        errors = report.errors.get(arm, [])
        line = f"{arm}: {len(stalls)} stalls, {len(errors)} errors"
        if stalls:
            s = stalls[0]
            line += f" (first stall: passes {s.start_pass}-{s.end_pass}, head {s.head_rid})"
        if errors:
            line += f" (first error: pass {errors[0].pass_}: {errors[0].error})"
        console.print(line)
    if report.closed_loop is not None:
        _closed_loop_summary(report.closed_loop, console)


def _closed_loop_summary(loop, console) -> None:
    from rich.table import Table

    table = Table("arm", "completed", "unfinished", "stalls", "over-asks", "exceptions", "queue peak",
                  title=f"closed loop from pass {loop.from_pass} ({loop.passes} passes)")
    for arm, o in loop.arms.items():
        table.add_row(arm, str(o.completed), str(o.unfinished), f"{o.stalls} ({o.stalled_passes} passes)",
                      str(o.over_asks), str(o.exceptions), str(o.queue_peak))
    console.print(table)


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--old", default="stock", show_default=True, help="Baseline arm: stock, fixed, a fix or a comma list.")
@click.option("--new", default="fixed", show_default=True, help="Arm compared with the baseline.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the report as JSON.")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default="none", show_default=True, help="Exit 1 when this is found.")
@click.option("--stall-passes", type=click.IntRange(min=1), default=DEFAULT_STALL_PASSES, show_default=True,
              help="Passes without admission (head request fits) that make a stall.")
@click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
              help="Worker processes for long traces (used from 4000 pass records up).")
@click.option("--closed-loop", is_flag=True, help="Also re-simulate each arm forward (closed loop).")
@click.option("--from", "from_pass", type=click.IntRange(min=0), default=0, show_default=True,
              help="Closed loop: start from this recorded pass.")
def replay(trace: Path, old: str, new: str, json_path: Path | None, fail_on: str, stall_passes: int,
           jobs: int, closed_loop: bool, from_pass: int) -> None:
    """Replay TRACE through the real sglang scheduler under two logic variants."""
    from rich.console import Console

    from schedtrace.replay.engine import replay_trace
    from schedtrace.tracer.contract.report import dump_report

    console = Console(stderr=False)
    progress = None
    task = None

    def on_progress(done: int, total: int) -> None:
        nonlocal progress, task
        if total < PROGRESS_MIN_PASSES or not console.is_terminal:
            return
        if progress is None:
            from rich.progress import Progress

            progress = Progress(console=console, transient=True)
            progress.start()
            task = progress.add_task("replaying", total=total)
        progress.update(task, completed=done)

    try:
        report = replay_trace(trace, old, new, stall_passes=stall_passes, jobs=jobs, on_progress=on_progress)
    finally:
        if progress is not None:
            progress.stop()
    if closed_loop:
        from schedtrace.replay.closed_loop import run_closed_loop

        arms = list(dict.fromkeys((old, new)))
        report.closed_loop = run_closed_loop(trace, arms, from_pass=from_pass, stall_passes=stall_passes)
    if json_path is not None:
        json_path.write_bytes(dump_report(report))
    _summary(report, console)
    if gate_tripped(report, fail_on):
        console.print(f"[red]--fail-on {fail_on}: tripped[/]")
        sys.exit(1)
