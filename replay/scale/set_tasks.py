"""A trace set's ranks and a closed loop's arms as executor tasks (``--ray``).

``replay_ranks``: each rank of a set replayed whole (open loop) in one task
(its parts found by the worker as ``executor.TraceFiles`` say), for a set
with at least as many ranks as the backend has workers. ``closed_loop_on``: the
scan and the loop input are built here once; each arm's closed loop is one
task. Both give the reports a local run gives, byte for byte: the same
code runs, only elsewhere, and results come back in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from schedtrace.replay.scale.executor import Executor, TraceFiles, local_paths, trace_files
from schedtrace.tracer.contract.report import ArmOutcome, ClosedLoop, Report
from schedtrace.tracer.contract.traceset import RankTrace


class _ArmDone(msgspec.Struct):
    """What the report needs of one arm's closed loop (msgpack back from the worker)."""

    outcome: ArmOutcome
    finished_at: dict[str, int]


def _arm_task(task: tuple) -> bytes:
    from schedtrace.replay.loop.run import run_arms

    loop, arm, stall_passes = task
    run = run_arms(None, [arm], stall_passes=stall_passes, loop=loop)[arm]
    return msgspec.msgpack.encode(_ArmDone(run.outcome, run.finished_at))


def closed_loop_on(executor: Executor, source, arms: Sequence[str], *, from_pass: int,
                   stall_passes: int | None) -> ClosedLoop:
    """``closed_loop.run_closed_loop`` with one task per arm."""
    from schedtrace.replay.loop.run import ArmRun, closed_loop_report, load_input, scan_trace
    from schedtrace.replay.engine import check_variants

    arms = list(dict.fromkeys(arms))
    check_variants(*arms)
    scan = scan_trace(source)
    loop = load_input(source, from_pass, scan)
    runs = {}
    for arm, data in zip(arms, executor.map(_arm_task, [(loop, arm, stall_passes) for arm in arms])):
        done = msgspec.msgpack.decode(data, type=_ArmDone)
        runs[arm] = ArmRun(arm, outcome=done.outcome, finished_at=done.finished_at)
    return closed_loop_report(loop, scan, runs)


@dataclass(frozen=True)
class RankReplay:
    """One rank's whole replay (it crosses to a worker)."""

    files: TraceFiles
    old: str
    new: str
    stall_passes: int


def _rank_task(task: RankReplay) -> bytes:
    from schedtrace.replay.engine import reopened, replay_trace

    # Open loop only: a report carries no float before its closed loop's self-check, which is
    # computed where the report is written (closed_loop_on), so msgpack gives back the same bytes.
    with local_paths(task.files) as paths, reopened(paths) as reader:
        report = replay_trace(reader, task.old, task.new, stall_passes=task.stall_passes)
    report.trace = task.files.paths[0]  # the driver's name for it, not a worker's copy
    return msgspec.msgpack.encode(report)


def replay_ranks(executor: Executor, ranks: Sequence[RankTrace], old: str, new: str, *,
                 stall_passes: int) -> list[Report]:
    """Each rank's open-loop report (``engine.replay_trace``), a task per rank."""
    from schedtrace.replay.engine import check_variants

    check_variants(old, new)
    tasks = [RankReplay(executor.locate(trace_files([str(p.path) for p in r.parts])), old, new, stall_passes)
             for r in ranks]
    reports = []
    retried = executor.retried
    for data in executor.map(_rank_task, tasks):
        report = msgspec.msgpack.decode(data, type=Report)
        report.retried_tasks, retried = executor.retried - retried, executor.retried
        reports.append(report)
    return reports
