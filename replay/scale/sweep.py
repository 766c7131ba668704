"""The what-if sweep: the closed loop of every arm in every cell of a configuration grid.

Each cell is the trace's closed loop from the recorded arrivals, with the
server arguments of the cell (``schedtrace.replay.scale.sweep_grid.apply_config``)
driving the real sglang code (``PassDriver`` built from the cell's header)
and sizing the state the loop evolves. Cells are independent: they run on
an ``Executor`` (local worker processes, or Ray tasks), each
task carrying its configured loop input (no file access in a worker), and
come back in grid order, so the report is the same bytes for any job count.

Next to the cells: the self-check of the stock arm under the recorded
configuration (``schedtrace.replay.loop.selfcheck``), the figure a what-if
should be read against.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from schedtrace.replay.loop.run import run_arms
from schedtrace.replay.scale.executor import Executor, LocalExecutor
from schedtrace.replay.loop.input import LoopInput, load_input
from schedtrace.replay.loop.scan import TraceScan, scan_trace
from schedtrace.replay.loop.selfcheck import quantile, self_check
from schedtrace.replay.scale.sweep_grid import Config, Value, apply_config, grid_cells, recorded_config
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, STOCK
from schedtrace.tracer.contract.report import ArmOutcome, SelfCheck, SweepArm, SweepCell, SweepReport

CellCallback = Callable[[int, int], None]  # (cells done, total)

NOTES = (
    "Decisions are the real sglang scheduler's, under each cell's server arguments.",
    "Time is counted in scheduler passes (one pass, one forward step), not seconds: a larger batch or chunk "
    "makes a real forward step slower, which a pass count does not show.",
    "Arrivals come at their recorded passes and every request stops at its recorded output length; "
    "clients that wait for answers would have sent differently.",
    "A request's prefix match is the one recorded, from the pass that first saw it; one retracted or "
    "preempted matches what its own prefills left in the tree.",
)


@dataclass(frozen=True)
class CellTask:
    """One cell's work, self-contained (it crosses to a worker process)."""

    loop: LoopInput  # configured for the cell
    config: Config
    arms: tuple[str, ...]
    stall_passes: int
    max_passes: int | None
    scan: TraceScan | None  # set on the task that also computes the self-check


class CellResult(msgspec.Struct):
    cell: SweepCell
    self_check: SelfCheck | None = None


def sweep_arm(outcome: ArmOutcome) -> SweepArm:
    """The sweep's figures of one arm's closed loop."""
    waits = list(outcome.first_admission_passes.values())
    return SweepArm(
        stalls=outcome.stalls,
        stalled_passes=outcome.stalled_passes,
        queue_peak=outcome.queue_peak,
        wait_p50=int(quantile(waits, 0.5)),
        wait_p90=int(quantile(waits, 0.9)),
        over_asks=outcome.over_asks,
        exceptions=outcome.exceptions,
        retractions=outcome.retractions,
        completed=outcome.completed,
        unfinished=outcome.unfinished,
        passes=outcome.passes,
        stuck_at=outcome.stuck_at,
    )


def run_cell(task: CellTask) -> bytes:
    """One cell (in a worker): its arms' figures, msgpack-encoded ``CellResult``."""
    runs = run_arms(None, list(task.arms), stall_passes=task.stall_passes, max_passes=task.max_passes,
                    loop=task.loop)
    check = None
    if task.scan is not None and STOCK in runs:
        stock = runs[STOCK]
        check = self_check(task.loop, task.scan, stock.outcome, stock.finished_at)
    cell = SweepCell(config=dict(task.config), arms={arm: sweep_arm(run.outcome) for arm, run in runs.items()})
    return msgspec.msgpack.encode(CellResult(cell=cell, self_check=check))


def plan(
    loop: LoopInput, scan: TraceScan, grid: dict[str, list[Value]], arms: list[str], *,
    stall_passes: int, max_passes: int | None,
) -> tuple[list[CellTask], bool]:
    """The tasks of a grid; the bool says whether the last one is an extra run for the self-check only.

    The self-check is computed by the cell that runs stock under the
    recorded configuration, when the grid has one; else by one more task.
    Every cell's configuration is applied here, before any work starts, so
    a cell that cannot exist (a pool smaller than the start holds) is one
    error up front.
    """
    recorded = recorded_config(loop.header, grid)
    tasks: list[CellTask] = []
    checked = False
    for config in grid_cells(grid):
        is_recorded = config == recorded and STOCK in arms and not checked
        checked = checked or is_recorded
        tasks.append(CellTask(apply_config(loop, config), config, tuple(arms), stall_passes, max_passes,
                              scan if is_recorded else None))
    if not checked:
        tasks.append(CellTask(loop, recorded, (STOCK,), stall_passes, max_passes, scan))
    return tasks, not checked


def run_sweep(
    path: str | os.PathLike[str],
    grid: dict[str, list[Value]],
    arms: list[str],
    *,
    from_pass: int = 0,
    stall_passes: int = DEFAULT_STALL_PASSES,
    max_passes: int | None = None,
    executor: Executor | None = None,
    on_cell: CellCallback | None = None,
) -> SweepReport:
    """Every arm's closed loop in every cell of ``grid`` (``sweep_grid.parse_grid``)."""
    from schedtrace.replay.engine import check_variants
    from schedtrace.arms.patching import sglang_version

    if not arms:
        raise UsageError("give at least one arm")
    if stall_passes < 1:
        raise UsageError(f"--stall-passes must be at least 1, got {stall_passes}")
    arms = list(dict.fromkeys(arms))
    check_variants(*arms)
    with TraceReader(path) as reader:
        scan = scan_trace(reader)
        loop = load_input(reader, from_pass, scan)
    tasks, extra = plan(loop, scan, grid, arms, stall_passes=stall_passes, max_passes=max_passes)
    executor = executor if executor is not None else LocalExecutor(1)
    retried = executor.retried
    results: list[CellResult] = []
    for data in executor.map(run_cell, tasks):
        results.append(msgspec.msgpack.decode(data, type=CellResult))
        if on_cell is not None:
            on_cell(len(results), len(tasks))
    check = next((r.self_check for r in results if r.self_check is not None), None)
    cells = [r.cell for r in (results[:-1] if extra else results)]
    return SweepReport(
        trace=str(path),
        sglang_version=sglang_version(),
        from_pass=from_pass,
        stall_passes=stall_passes,
        arms=arms,
        grid={key: list(values) for key, values in grid.items()},
        keys=list(grid),
        recorded=recorded_config(loop.header, grid),
        cells=cells,
        self_check=check,
        notes=list(NOTES),
        retried_tasks=executor.retried - retried,
    )
