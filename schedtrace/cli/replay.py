"""``schedtrace replay TRACE...``: open-loop replay under two arms, per rank, gated for CI.

Exit codes: 0 the gate holds, 1 ``--fail-on`` tripped (on any rank), 2 usage
or input error (one line on stderr, no traceback; see schedtrace.cli).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import (chosen_ranks, executor_for, from_pass_option, jobs_option, json_option,
                                    old_new_options, ray_options, stall_passes_option, damaged_traces_argument)
from schedtrace.cli.holes import print_holes
from schedtrace.cli.per_rank import exit_if_tripped, retry_note, write_reports
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural
from schedtrace.tracer.contract.names import STOCK
from schedtrace.tracer.contract.report import ClosedLoop, Report, SelfCheck
from schedtrace.tracer.contract.report.run import PREFIX_MATCHES_RECORDED, PREFIX_MATCHES_TREE
from schedtrace.tracer.contract.traceset import RankTrace, TraceSet

if TYPE_CHECKING:
    from rich.console import Console

FAIL_ON = ("none", "divergence", "stall", "error", "gaps")
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
    if fail_on == "gaps":
        return bool(report.holes.count)
    return False


def _fidelity(report: Report, console: Console) -> None:
    fid = report.fidelity
    style = "green" if fid.matched == fid.total else "red"
    present = " over the passes present" if report.holes.count else ""  # the holes are listed above
    console.print(f"fidelity ({fid.arm} vs recording): [{style}]{fid.matched}/{fid.total}[/]{present}")
    if fid.order_total:
        style = "green" if fid.order_matched == fid.order_total else "red"
        console.print(f"queue order matched: [{style}]{fid.order_matched}/{fid.order_total}[/]")
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


def _fix_notes(report: Report, console: Console) -> None:
    """How each fix meets a hybrid trace's pools (the report's ``fix_notes``)."""
    if not report.fix_notes:
        return
    console.print("fixes on these pools:")
    for fix, note in report.fix_notes.items():
        console.print(f"  {fix}: {note}")


# Where the arms' cache hits came from (docs/closed-loop.md), in the table's title
PREFIX_SOURCES = {PREFIX_MATCHES_TREE: ", cache hits per arm's tree", PREFIX_MATCHES_RECORDED: ", cache hits as recorded"}


def closed_loop_table(loop: ClosedLoop):
    table = compact_table(("arm", "done", "left", "stalls", "stalled\npasses", "over-asks", "exceptions",
                           "queue\npeak"), shrink=("arm",),
                          title=f"closed loop from pass {loop.from_pass} ({plural(loop.passes, 'pass')})"
                                + PREFIX_SOURCES.get(loop.prefix_matches, ""))
    for arm, o in loop.arms.items():
        table.add_row(arm, str(o.completed), str(o.unfinished), str(o.stalls), str(o.stalled_passes),
                      str(o.over_asks), str(o.exceptions), str(o.queue_peak))
    return table


def self_check_table(check: SelfCheck):
    """How closely the stock arm's closed loop reproduced the recording (docs/closed-loop.md)."""
    table = compact_table(("self-check", "recorded", "loop"), shrink=("self-check",),
                          title=f"self-check: the {check.arm} loop against the recording")
    table.add_row("first-admission wait p50 (passes)", str(check.recorded_wait_p50), str(check.loop_wait_p50))
    table.add_row("first-admission wait p90 (passes)", str(check.recorded_wait_p90), str(check.loop_wait_p90))
    table.add_row("queue peak", str(check.recorded_queue_peak), str(check.loop_queue_peak))
    table.add_row("admitted in one only", str(check.recorded_only), str(check.loop_only))
    return table


SMALL_WAIT = 10  # passes: a recorded wait below this prints its passes beside the relative error


def wait_error(error: float, recorded: int, loop: int) -> str:
    """``0.0%``, or ``33.3% (3 → 4 passes)`` where the recorded wait is short enough that a ratio misleads."""
    passes = f" ({recorded} → {loop} passes)" if recorded < SMALL_WAIT else ""
    return f"{error:.1%}{passes}"


def _self_check(check: SelfCheck, console: Console) -> None:
    console.print(self_check_table(check))
    console.print(f"  wait error p50 {wait_error(check.wait_error_p50, check.recorded_wait_p50, check.loop_wait_p50)}, "
                  f"p90 {wait_error(check.wait_error_p90, check.recorded_wait_p90, check.loop_wait_p90)} over "
                  f"{plural(check.requests, 'request')}; completion order of {check.finished} finished: "
                  f"{check.order_agreement:.0%} of pairs agree, tau-b {check.kendall_tau:.2f}")


def render(report: Report, console: Console) -> None:
    console.print(f"[bold]{report.trace}[/]")  # a line of its own: a long path must not wrap the rest
    console.print(f"{plural(report.passes, 'pass')}, {plural(report.aiter_events, 'aiter event')}, "
                  f"{report.old} vs {report.new}")
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    print_holes(report.holes, console, title=False)  # the warnings say how much is missing
    if report.same_as is not None:
        console.print(f"[bold]same as {report.same_as}[/]: {report.same_as_why}")
    if retry_note(report.retried_tasks):
        console.print(retry_note(report.retried_tasks))
    if report.unknown_records:
        skipped = ", ".join(f"{tag}={n}" for tag, n in report.unknown_records.items())
        console.print(f"[yellow]skipped unknown records:[/] {skipped}")
    if report.old == STOCK:
        _fidelity(report, console)
    _fix_notes(report, console)
    _divergences(report, console)
    _arm_lines(report, console)
    if report.closed_loop is not None:
        console.print(closed_loop_table(report.closed_loop))
        if report.closed_loop.self_check is not None:
            _self_check(report.closed_loop.self_check, console)


@click.command(short_help="Replay a trace under two arms and compare them, per rank.")
@damaged_traces_argument
@old_new_options()
@json_option("the report (docs/replay-report.md; several ranks: one per rank)")
@click.option("--fail-on", type=click.Choice(FAIL_ON), default="none", show_default=True,
              help="Exit 1 when this is found (on any rank).")
@stall_passes_option()
@jobs_option
@ray_options
@click.option("--closed-loop", is_flag=True, help="Also re-simulate each arm forward (closed loop).")
@from_pass_option
def replay(traces: TraceSet, rank: str | None, run_id: str | None, old: str, new: str, json_out: str | None,
           fail_on: str, stall_passes: int, jobs: int, use_ray: bool, address: str | None, closed_loop: bool,
           from_pass: int) -> None:
    """Replay each rank of TRACE... (files, globs or directories; a rank's parts read as one)
    through the real sglang scheduler under two logic variants."""
    from schedtrace.tracer.contract.report import dump_report

    with traces, Activity() as activity:
        run, ranks = chosen_ranks(traces, rank, run_id)
        with executor_for(use_ray, address, jobs, activity) as executor:
            activity.import_sglang()
            reports = _replay_all(ranks, executor, activity, use_ray, old, new, stall_passes=stall_passes,
                                  closed_loop=closed_loop, from_pass=from_pass, run_label=run.label)
    write_reports(run, reports, json_out, dump_report, render)
    exit_if_tripped(reports, lambda report: gate_tripped(report, fail_on), f"--fail-on {fail_on}")


def _replay_all(ranks: tuple[RankTrace, ...], executor, activity: Activity, use_ray: bool, old: str, new: str, *,
                stall_passes: int, closed_loop: bool, from_pass: int, run_label: str) -> dict[str, Report]:
    """Each rank's report: one rank per agreeing TP group replayed, the others its copies
    (``replay.rank_groups``). On Ray, a set of at least as many ranks to replay as workers runs
    a task per rank; else each rank's pass ranges (and closed-loop arms) are the tasks."""
    from schedtrace.replay.loop.run import run_closed_loop
    from schedtrace.replay.engine import replay_trace
    from schedtrace.replay.rank_groups import copied_report, plan_ranks
    from schedtrace.replay.scale.set_tasks import closed_loop_on, replay_ranks

    if len(ranks) > 1:
        activity.phase(f"checking that the {len(ranks)} ranks agree")
    plan = plan_ranks(ranks, run=run_label)
    replayed = plan.replayed
    whole = use_ray and 1 < len(replayed) and executor.workers <= len(replayed)
    if whole:
        activity.phase(f"replaying {len(replayed)} ranks, a Ray task each")
        found = iter(replay_ranks(executor, replayed, old, new, stall_passes=stall_passes))
    reports: dict[str, Report] = {}
    for r in replayed:
        which = f" ({r.label})" if len(ranks) > 1 else ""
        retried = executor.retried
        if whole:
            report = next(found)
            retried -= report.retried_tasks
        else:
            report = replay_trace(r, old, new, stall_passes=stall_passes, executor=executor,
                                  on_progress=activity.passes(f"replaying {old} and {new}{which}"))
        if closed_loop:
            arms = list(dict.fromkeys((old, new)))
            activity.phase(f"closed loop: {', '.join(arms)}{which}")  # no per-pass progress from closed_loop yet
            report.closed_loop = (closed_loop_on(executor, r, arms, from_pass=from_pass, stall_passes=stall_passes)
                                  if use_ray else run_closed_loop(r, arms, from_pass=from_pass,
                                                                  stall_passes=stall_passes))
        report.retried_tasks = executor.retried - retried  # the pass ranges' and the arms'
        reports[r.label] = report
    for r in ranks:  # each rank not replayed gets its group's replayed rank's report, in set order
        if r.label in plan.same_as:
            reports[r.label] = copied_report(reports[plan.same_as[r.label]], r, plan.same_as[r.label],
                                             plan.why[r.label])
    return {r.label: reports[r.label] for r in ranks}
