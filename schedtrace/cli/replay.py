"""``schedtrace replay TRACE``: open-loop replay under two arms, gated for CI.

Exit codes: 0 the gate holds, 1 ``--fail-on`` tripped, 2 usage or input
error (one line on stderr, no traceback; see schedtrace.cli).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import (STDOUT, from_pass_option, jobs_option, json_option, old_new_options,
                                    stall_passes_option, trace_argument, write_json)
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.tracer.contract.report import ClosedLoop, Report

if TYPE_CHECKING:
    from rich.console import Console

FAIL_ON = ("none", "divergence", "stall", "error")
MAX_MISMATCHES_SHOWN = 10
MAX_PASSES_LISTED = 5  # per divergence kind


def gate_tripped(report: Report, fail_on: str) -> bool:
    """Whether the report trips ``--fail-on``."""
    if fail_on == "divergence":
        return bool(report.divergences)
    if fail_on == "stall":
        return bool(report.stalls.get(report.new))
    if fail_on == "error":
        return bool(report.errors.get(report.new))
    return False


def _fidelity(report: Report, console: Console) -> None:
    fid = report.fidelity
    style = "green" if fid.matched == fid.total else "red"
    console.print(f"fidelity ({fid.arm} vs recording): [{style}]{fid.matched}/{fid.total}[/]")
    for m in fid.mismatches[:MAX_MISMATCHES_SHOWN]:
        console.print(f"  pass {m.pass_}: {', '.join(m.fields)}")
    if len(fid.mismatches) > MAX_MISMATCHES_SHOWN:
        console.print(f"  ... {len(fid.mismatches) - MAX_MISMATCHES_SHOWN} more")


def _divergences(report: Report, console: Console) -> None:
    if not report.divergences:
        console.print("divergences: 0")
        return
    by_kind: dict[str, list] = {}
    for d in report.divergences:
        for kind in d.kinds:
            by_kind.setdefault(kind, []).append(d)
    table = compact_table(("kind", "passes", "first at", "fixes"), shrink=("first at", "fixes"),
                          title=f"divergences: {len(report.divergences)}")
    for kind, items in by_kind.items():
        first = ", ".join(str(d.pass_) for d in items[:MAX_PASSES_LISTED])
        more = " ..." if len(items) > MAX_PASSES_LISTED else ""
        fixes = sorted({f for d in items for f in d.fixes})
        table.add_row(kind, str(len(items)), first + more, ", ".join(fixes) or "-")
    console.print(table)


def _arm_lines(report: Report, console: Console) -> None:
    for arm in dict.fromkeys((report.old, report.new)):
        stalls = report.stalls.get(arm, [])
        errors = report.errors.get(arm, [])
        console.print(f"{arm}: {plural(len(stalls), 'stall')}, {plural(len(errors), 'error')}")
        if stalls:
            s = stalls[0]
            console.print(f"  first stall: passes {s.start_pass}-{s.end_pass}, head {s.head_rid}")
        if errors:
            console.print(f"  first error: pass {errors[0].pass_}: {errors[0].error}")


def closed_loop_table(loop: ClosedLoop):
    table = compact_table(("arm", "done", "left", "stalls", "stalled\npasses", "over-asks", "exceptions",
                           "queue\npeak"), shrink=("arm",),
                          title=f"closed loop from pass {loop.from_pass} ({plural(loop.passes, 'pass')})")
    for arm, o in loop.arms.items():
        table.add_row(arm, str(o.completed), str(o.unfinished), str(o.stalls), str(o.stalled_passes),
                      str(o.over_asks), str(o.exceptions), str(o.queue_peak))
    return table


def render(report: Report, console: Console) -> None:
    console.print(f"[bold]{report.trace}[/]: {plural(report.passes, 'pass')}, "
                  f"{plural(report.aiter_events, 'aiter event')}, {report.old} vs {report.new}")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    if report.unknown_records:
        skipped = ", ".join(f"{tag}={n}" for tag, n in report.unknown_records.items())
        console.print(f"[yellow]skipped unknown records:[/] {skipped}")
    if report.old == "stock":
        _fidelity(report, console)
    _divergences(report, console)
    _arm_lines(report, console)
    if report.closed_loop is not None:
        console.print(closed_loop_table(report.closed_loop))


@click.command(short_help="Replay a trace under two arms and compare them.")
@trace_argument
@old_new_options()
@json_option("the report (docs/replay-report.md)")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default="none", show_default=True,
              help="Exit 1 when this is found.")
@stall_passes_option()
@jobs_option
@click.option("--closed-loop", is_flag=True, help="Also re-simulate each arm forward (closed loop).")
@from_pass_option
def replay(trace: Path, old: str, new: str, json_out: str | None, fail_on: str, stall_passes: int,
           jobs: int, closed_loop: bool, from_pass: int) -> None:
    """Replay TRACE through the real sglang scheduler under two logic variants."""
    from schedtrace.tracer.contract.report import dump_report

    with Activity() as activity:
        activity.import_sglang()
        from schedtrace.replay.engine import replay_trace

        report = replay_trace(trace, old, new, stall_passes=stall_passes, jobs=jobs,
                              on_progress=activity.passes(f"replaying {old} and {new}"))
        if closed_loop:
            from schedtrace.replay.closed_loop import run_closed_loop

            arms = list(dict.fromkeys((old, new)))
            activity.phase(f"closed loop: {', '.join(arms)}")  # no per-pass progress from closed_loop yet
            report.closed_loop = run_closed_loop(trace, arms, from_pass=from_pass, stall_passes=stall_passes)
    if json_out is not None:
        write_json(json_out, dump_report(report))
    if json_out != STDOUT:
        render(report, summary_console())
    if gate_tripped(report, fail_on):
        click.echo(f"schedtrace: --fail-on {fail_on}: tripped", err=True)
        raise click.exceptions.Exit(1)
