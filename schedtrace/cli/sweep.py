"""``schedtrace sweep TRACE --set KEY=V1,V2 ...``: what-if closed loops over a grid of server arguments.

Every ``--set``, ``--arms`` and ``--heatmap`` choice is checked before
sglang is imported. Exit codes: 0 done, 2 usage or input error (one line on
stderr, no traceback; see schedtrace.cli).
"""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import (DEFAULT_JOBS, STDOUT, executor_for, from_pass_option, json_option, ray_options,
                                    stall_passes_option, trace_argument, write_json)
from schedtrace.cli.per_rank import retry_note
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.replay.scale.sweep_grid import KEYS, Value, parse_grid
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import FIXED, STOCK
from schedtrace.tracer.contract.report import SweepArm, SweepReport

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# SweepArm field -> column header (two lines at most, so a table of two swept keys fits 80 columns).
COLUMNS: dict[str, str] = {
    "stalls": "stalls\n(passes)",  # with stalled_passes
    "queue_peak": "queue\npeak",
    "wait_p50": "wait\np50",
    "wait_p90": "wait\np90",
    "over_asks": "over\nasks",
    "exceptions": "exc",
    "retractions": "re-\ntract",
    "completed": "done",
    "unfinished": "left",
}
METRICS = ("stalls", "stalled_passes", *list(COLUMNS)[1:], "passes")
TABLE_KEYS = 2  # swept keys per table; more: one table per value of the others
ARM_LABEL_WIDTH = 6  # a longer arm name is a letter in the tables, with a legend
HIGHER_IS_BETTER = frozenset({"completed"})
ARM_JOIN = "+"  # joins the fixes of one arm: --arms stock,latch+one-chunk


def _grid(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, list[Value]]:
    return parse_grid(value)  # a UsageError: one line, exit 2, before sglang is imported


def _arms(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
    from schedtrace.arms.variants import canonical_variant  # names and arm files' text, no sglang
    from schedtrace.tracer.contract.errors import ArmPatchError

    arms = [a.strip().replace(ARM_JOIN, ",") for a in value.split(",")]
    if "" in arms:
        raise UsageError(f"--arms: an empty arm in {value!r}")
    canonical = []
    for arm in arms:
        try:
            canonical.append(canonical_variant(arm))  # a file by its label, FILE@HASH
        except ArmPatchError:
            raise
        except UsageError as exc:
            raise UsageError(f"--arms {arm.replace(',', ARM_JOIN)}: {exc}") from None
    return list(dict.fromkeys(canonical))


def heatmap_axes(grid: dict[str, list[Value]], x: str | None, y: str | None) -> tuple[str, str | None]:
    """The heatmap's axes: given, else the first two keys of the grid (one key: a single row)."""
    keys = list(grid)
    for name, key in (("--x", x), ("--y", y)):
        if key is not None and key not in grid:
            raise UsageError(f"{name} {key}: not a key of the grid ({', '.join(keys)})")
    x = x or next(k for k in keys if k != y)
    if y is None:
        y = next((k for k in keys if k != x), None)
    if x == y:
        raise UsageError(f"--x and --y are both {x}")
    return x, y


# ------------------------------------------------------------------- views


def _value(v: Value) -> str:
    return str(v)


def _varying(report: SweepReport) -> list[str]:
    varying = [k for k in report.keys if len(report.grid[k]) > 1]
    return varying or list(report.keys)


def arm_labels(arms: list[str]) -> dict[str, str]:
    """What the tables call each arm: its name, or a letter when the name is long."""
    letters = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    return {arm: arm if len(arm) <= ARM_LABEL_WIDTH else next(letters, arm) for arm in arms}


def _cell_text(figures: SweepArm, field: str) -> str:
    if field == "stalls" and figures.stalls:
        return f"{figures.stalls} ({figures.stalled_passes})"
    return str(getattr(figures, field))


def sweep_tables(report: SweepReport) -> list[Table]:
    """One row per cell and arm, the last two varying keys as columns; one table per value of
    the keys before them; the keys with one value are in the title."""
    varying = _varying(report)
    grouped, shown = varying[:-TABLE_KEYS], varying[-TABLE_KEYS:]
    fixed = [f"{k}={_value(report.grid[k][0])}" for k in report.keys if k not in varying]
    labels = arm_labels(report.arms)
    tables = []
    for group in product(*(report.grid[k] for k in grouped)):
        where = dict(zip(grouped, group))
        title = ", ".join([*(f"{k}={_value(v)}" for k, v in where.items()), *fixed]) or None
        table = compact_table((*(KEYS[k] for k in shown), "arm", *COLUMNS.values()), title=title)
        for cell in report.cells:
            if any(cell.config[k] != v for k, v in where.items()):
                continue
            for i, arm in enumerate(report.arms):
                keys = [_value(cell.config[k]) if i == 0 else "" for k in shown]
                table.add_row(*keys, labels[arm], *(_cell_text(cell.arms[arm], f) for f in COLUMNS))
        tables.append(table)
    return tables


def _shade(t: float) -> str:
    """Background from green (t = 0, best) through yellow to red (t = 1)."""
    r, g = (int(510 * t), 160) if t < 0.5 else (255, int(160 * (2 - 2 * t)))
    return f"black on rgb({min(r, 255)},{g},60)"


def heatmaps(report: SweepReport, metric: str, x: str, y: str | None) -> list[tuple[str, Table]]:
    """``metric`` over ``x`` (columns) and ``y`` (rows): one (title, map) per arm and per value of
    the other keys."""
    from rich.table import Table

    others = [k for k in report.keys if k not in (x, y) and len(report.grid[k]) > 1]
    by_config = {tuple(sorted(c.config.items())): c for c in report.cells}
    ys = report.grid[y] if y is not None else [None]
    maps = []
    for arm in report.arms:
        for fixed in product(*(report.grid[k] for k in others)):
            rest = dict(zip(others, fixed))

            def figure(xv: Value, yv: Value | None) -> int:
                config = {**{k: report.grid[k][0] for k in report.keys}, **rest, x: xv}
                if y is not None:
                    config[y] = yv
                figures: SweepArm = by_config[tuple(sorted(config.items()))].arms[arm]
                return getattr(figures, metric)

            values = {(xv, yv): figure(xv, yv) for xv in report.grid[x] for yv in ys}
            low, high = min(values.values()), max(values.values())
            where = "".join(f", {KEYS[k]}={_value(v)}" for k, v in rest.items())
            table = Table(show_edge=False, pad_edge=False)
            table.add_column(f"{KEYS[y]} \\ {KEYS[x]}" if y is not None else KEYS[x], no_wrap=True)
            for xv in report.grid[x]:
                table.add_column(_value(xv), justify="right", no_wrap=True)
            for yv in ys:
                cells = []
                for xv in report.grid[x]:
                    v = values[(xv, yv)]
                    t = 0.5 if high == low else (v - low) / (high - low)
                    cells.append(f"[{_shade(1 - t if metric in HIGHER_IS_BETTER else t)}] {v} [/]")
                table.add_row(_value(yv) if y is not None else "", *cells)
            maps.append((f"{metric}, {arm}{where}", table))
    return maps


def footer_lines(report: SweepReport) -> list[str]:
    """What a what-if can and cannot tell, and the self-check to read it against."""
    from schedtrace.replay.loop.selfcheck import self_check_summary

    lines = [f"note: {n}" for n in report.notes]
    if report.self_check is not None:
        lines.append(self_check_summary(report.self_check))
    return lines


def render(report: SweepReport, console: Console, heatmap: tuple[str, str, str | None] | None = None) -> None:
    console.print(f"[bold]{report.trace}[/]: {plural(len(report.cells), 'cell')} × "
                  f"{plural(len(report.arms), 'arm')}, closed loop from pass {report.from_pass}; "
                  f"waits in passes, from arrival to first admission")
    for arm, label in arm_labels(report.arms).items():
        if label != arm:
            console.print(f"{label}: {arm}", highlight=False)
    for table in sweep_tables(report):
        console.print(table)
    if heatmap is not None:
        for title, table in heatmaps(report, *heatmap):
            console.print(f"[bold]{title}[/]", highlight=False)
            console.print(table)
    for line in footer_lines(report):
        console.print(line, highlight=False, soft_wrap=False)
    if retry_note(report.retried_tasks):
        console.print(retry_note(report.retried_tasks), highlight=False)


@click.command(short_help="What-if: closed loops of each arm over a grid of server arguments.")
@trace_argument
@click.option("--set", "grid", multiple=True, metavar="KEY=V1,V2", callback=_grid,
              help=f"A server argument and its values to sweep ({', '.join(KEYS)}); repeat for a grid.")
@click.option("--arms", default=f"{STOCK},{FIXED}", show_default=True, metavar="ARM,ARM", callback=_arms,
              help=f"The arms run in every cell; join fixes of one arm with '{ARM_JOIN}' (latch+one-chunk).")
@json_option("the sweep (docs/sweep.md)")
@click.option("--heatmap", type=click.Choice(METRICS), metavar="METRIC",
              help=f"Also draw METRIC over --x and --y ({', '.join(METRICS)}).")
@click.option("--x", "x_key", type=click.Choice(list(KEYS)), metavar="KEY", help="Heatmap columns (a --set key).")
@click.option("--y", "y_key", type=click.Choice(list(KEYS)), metavar="KEY", help="Heatmap rows (a --set key).")
@stall_passes_option()
@from_pass_option
@click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, metavar="N", show_default=True,
              help="Worker processes running cells (the result is the same for any N; with --ray: Ray's CPUs).")
@ray_options
def sweep(trace: Path, grid: dict[str, list[Value]], arms: list[str], json_out: str | None, heatmap: str | None,
          x_key: str | None, y_key: str | None, stall_passes: int, from_pass: int, jobs: int, use_ray: bool,
          address: str | None) -> None:
    """Run the closed loop of every arm in every cell of the --set grid, from the recorded arrivals,
    with the real sglang scheduler under each cell's server arguments (docs/sweep.md)."""
    from schedtrace.tracer.contract.report import dump_sweep

    axes = heatmap_axes(grid, x_key, y_key) if heatmap is not None else None
    if heatmap is None and (x_key or y_key):
        raise UsageError("--x and --y draw a heatmap: give --heatmap METRIC too")
    with Activity() as activity, executor_for(use_ray, address, jobs, activity) as executor:
        activity.import_sglang()
        from schedtrace.replay.scale.sweep import run_sweep

        activity.phase("sweeping")
        report = run_sweep(trace, grid, arms, from_pass=from_pass, stall_passes=stall_passes, executor=executor,
                           on_cell=lambda done, total: activity.phase(f"sweeping: {done}/{total} runs done"))
    if json_out is not None:
        write_json(json_out, dump_sweep(report))
    if json_out != STDOUT:
        render(report, summary_console(), (heatmap, *axes) if heatmap is not None and axes else None)
