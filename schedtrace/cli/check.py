"""``schedtrace check TRACE... --new ARM``: a change over a corpus of traces, one row per trace.

Every rank of every run in TRACE... (files, globs or directories) is replayed
open loop under ``--old`` (default stock) and ``--new``; a row says how many
passes decide otherwise and the first of them, the stalls the new arm adds
and removes (a stall of one arm overlapping none of the other's), and the
new arm's errors. ``--closed-loop`` also runs both arms forward and adds the
first-admission wait p50 and p90 of each (passes, nearest-rank). A total line
ends the table.

Exit codes: 0 the gate holds, 1 ``--fail-on`` tripped on any trace, 2 usage
or input error (an arm file that does not apply: one line naming the file and
the hunk, before any work).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import msgspec

from schedtrace.cli.options import (STDOUT, executor_for, from_pass_option, jobs_option, json_option,
                                    old_new_options, ray_options, stall_passes_option, traces_argument,
                                    write_json)
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.report import CheckReport, CheckRow, Report, Stall
from schedtrace.tracer.contract.traceset import RankTrace, TraceSet

if TYPE_CHECKING:
    from rich.console import Console

GATES = ("none", "change", "stall", "error", "wait")


def _overlaps(a: Stall, others: list[Stall]) -> bool:
    return any(a.start_pass <= b.end_pass and b.start_pass <= a.end_pass for b in others)


def row_of(name: str, report: Report) -> CheckRow:
    from schedtrace.replay.loop.selfcheck import quantile

    old, new = report.stalls.get(report.old, []), report.stalls.get(report.new, [])
    changed = sorted({d.pass_ for d in report.divergences})
    old_errors = {e.pass_ for e in report.errors.get(report.old, [])}
    row = CheckRow(
        trace=name, passes=report.passes, changed=len(report.divergences),
        first_changed=changed[0] if changed else None,
        stalls_added=sum(not _overlaps(s, old) for s in new),
        stalls_removed=sum(not _overlaps(s, new) for s in old),
        errors_added=sum(e.pass_ not in old_errors for e in report.errors.get(report.new, [])),
    )
    loop = report.closed_loop
    if loop is not None:
        waits = [list(loop.arms[arm].first_admission_passes.values()) for arm in (report.old, report.new)]
        row.wait_p50 = tuple(int(quantile(w, 0.5)) for w in waits)
        row.wait_p90 = tuple(int(quantile(w, 0.9)) for w in waits)
    return row


def total_of(rows: list[CheckRow]) -> CheckRow:
    firsts = [r.first_changed for r in rows if r.first_changed is not None]
    return CheckRow(
        trace=f"total ({plural(len(rows), 'trace')})", passes=sum(r.passes for r in rows),
        changed=sum(r.changed for r in rows), first_changed=None if not firsts else min(firsts),
        stalls_added=sum(r.stalls_added for r in rows), stalls_removed=sum(r.stalls_removed for r in rows),
        errors_added=sum(r.errors_added for r in rows),
    )


def trips(row: CheckRow, gates: list[str]) -> bool:
    return (("change" in gates and row.changed > 0) or ("stall" in gates and row.stalls_added > 0)
            or ("error" in gates and row.errors_added > 0)
            or ("wait" in gates and row.wait_p90 is not None and row.wait_p90[1] > row.wait_p90[0]))


def _wait(pair: tuple[int, int] | None) -> str:
    if pair is None:
        return "-"
    return f"{pair[0]}→{pair[1]}"


def _shown(trace: str) -> str:
    """A row's trace as the table shows it: the file's name (and rank); the JSON keeps the path."""
    path, _, rank = trace.partition(" (")
    return Path(path).name + (f" ({rank}" if rank else "")


def render(report: CheckReport, console: Console) -> None:
    console.print(f"check: {report.old} → {report.new}")
    for line in report.arms.values():
        console.print(f"  arm {line}")
    closed = any(r.wait_p50 is not None for r in report.rows)
    headers = ["trace", "passes", "changed", "first", "+stalls", "-stalls", "+errors"]
    headers += ["p50 wait", "p90 wait"] if closed else []
    table = compact_table(headers, shrink=("trace",))
    for row in [*report.rows, report.total]:
        cells = [row.trace if row is report.total else _shown(row.trace), str(row.passes), str(row.changed), "-" if row.first_changed is None else str(row.first_changed),
                 str(row.stalls_added), str(row.stalls_removed), str(row.errors_added)]
        if closed:
            cells += [_wait(row.wait_p50), _wait(row.wait_p90)]
        mark = "[red]" if row.trace in report.tripped else ""
        table.add_row(*(f"{mark}{c}[/]" if mark else c for c in cells))
    console.print(table)
    if report.tripped:
        console.print(f"[red]--fail-on {','.join(report.fail_on)}: tripped on {plural(len(report.tripped), 'trace')}[/]")


def _name(rank: RankTrace, run_ranks: int) -> str:
    """A trace's file, and its rank when its run has several."""
    return rank.path if run_ranks == 1 else f"{rank.path} ({rank.label})"


def _reports(ranks: list[RankTrace], executor, activity: Activity, use_ray: bool, old: str, new: str, *,
             stall_passes: int, closed_loop: bool, from_pass: int) -> list[Report]:
    from schedtrace.replay.loop.run import run_closed_loop
    from schedtrace.replay.engine import replay_trace
    from schedtrace.replay.scale.set_tasks import closed_loop_on, replay_ranks

    if use_ray:  # the corpus spread over the cluster: a task per trace
        activity.phase(f"replaying {plural(len(ranks), 'trace')}, a Ray task each")
        reports = replay_ranks(executor, ranks, old, new, stall_passes=stall_passes)
    else:
        reports = [replay_trace(r, old, new, stall_passes=stall_passes, executor=executor,
                                on_progress=activity.passes(f"replaying {Path(r.path).name}")) for r in ranks]
    if closed_loop:
        arms = list(dict.fromkeys((old, new)))
        for r, report in zip(ranks, reports):
            activity.phase(f"closed loop: {Path(r.path).name}")
            report.closed_loop = (closed_loop_on(executor, r, arms, from_pass=from_pass, stall_passes=stall_passes)
                                  if use_ray else run_closed_loop(r, arms, from_pass=from_pass, stall_passes=stall_passes))
    return reports


@click.command(short_help="Check a change over a corpus of traces: one row per trace, gated for CI.")
@traces_argument
@old_new_options(new=None)
@click.option("--closed-loop", is_flag=True, help="Also run both arms forward: first-admission wait p50/p90.")
@from_pass_option
@json_option("the rows and the total")
@click.option("--fail-on", "fail_on", multiple=True, type=click.Choice(GATES), default=("stall",), show_default=True,
              help="Exit 1 when a trace shows this (repeatable): a changed decision, an added stall, "
              "an added error, a worse wait p90 (needs --closed-loop).")
@stall_passes_option()
@jobs_option
@ray_options
def check(traces: TraceSet, rank: str | None, run_id: str | None, old: str, new: str | None, closed_loop: bool,
          from_pass: int, json_out: str | None, fail_on: tuple[str, ...], stall_passes: int, jobs: int,
          use_ray: bool, address: str | None) -> None:
    """Replay every trace of TRACE... under --old and --new (an sglang diff, an edits module, a fix)
    and list, per trace, what the change does to the scheduler's decisions."""
    from schedtrace.arms import user
    from schedtrace.arms.variants import parse_variant

    if new is None:
        raise UsageError("--new ARM: the change to check (a .diff/.patch, an edits .py, a fix)")
    gates = [g for g in dict.fromkeys(fail_on) if g != "none"]
    if "wait" in gates and not closed_loop:
        raise UsageError("--fail-on wait compares closed-loop waits: give --closed-loop")
    labels = sorted(m for arm in (old, new) for m in parse_variant(arm) if user.is_label(m))
    with traces, Activity() as activity:
        chosen = [(r, len(run.ranks)) for run in (traces.runs if run_id is None else (traces.run(run_id),))
                  for r in (run.ranks if rank is None else (run.rank(rank),))]
        ranks = [r for r, _ in chosen]
        with executor_for(use_ray, address, jobs, activity) as executor:
            activity.import_sglang()
            reports = _reports(ranks, executor, activity, use_ray, old, new, stall_passes=stall_passes,
                               closed_loop=closed_loop, from_pass=from_pass)
    rows = [row_of(_name(r, n), report) for (r, n), report in zip(chosen, reports)]
    result = CheckReport(old=old, new=new, arms={label: user.describe(label) for label in labels},
                         fail_on=gates, rows=rows, total=total_of(rows),
                         tripped=[row.trace for row in rows if trips(row, gates)])
    if json_out is not None:
        write_json(json_out, msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
    if json_out != STDOUT:
        render(result, summary_console())
    if result.tripped:
        raise click.exceptions.Exit(1)
