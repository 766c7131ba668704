"""``schedtrace ranks PATH...``: did the scheduler ranks of one run decide the same?

PATH: trace files, directories (their ``*.trace`` files) or glob patterns;
the files are grouped into runs, ranks and parts
(``schedtrace.tracer.contract.traceset``). The comparison itself is
``schedtrace.tracer.analysis.ranks`` (pure, also the ``--json`` output);
this module only renders it.

Exit codes: 0 the ranks agree, 1 a desync, 2 usage or input error (one line
on stderr, no traceback; see schedtrace.cli).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click
import msgspec

from schedtrace.cli.options import STDOUT, json_option, write_json
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.tracer.analysis.ranks import DEFAULT_ROWS, compare_ranks
from schedtrace.tracer.contract.report import DpReport, RankDiff, RanksReport
from schedtrace.tracer.contract.errors import TraceSetError
from schedtrace.tracer.contract.traceset import open_traceset

if TYPE_CHECKING:
    from rich.console import Console

MODE_TEXT = {"tp": "plain TP", "dp-attention": "DP attention", "dp": "data parallel"}
KIND_TEXT = {
    "inputs": "the inputs already differed: the cause is upstream of the scheduler",
    "decision": "same inputs, different decision: a scheduler non-determinism",
}
VALUE_CHARS = 28  # a value cell of the difference table


def dump_ranks(report: RanksReport) -> bytes:
    """The deterministic JSON report: the same traces give the same bytes."""
    return msgspec.json.encode(report) + b"\n"


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _where(d: RankDiff) -> str:
    """``pass clock 43 (pass 13; tp1 pass 14)``: the ranks' usual pass seq, then the ones that differ."""
    seqs = list(d.passes.values())
    usual = max(seqs, key=lambda s: (seqs.count(s), s is not None))
    others = [f"{r} {'idle' if s is None else f'pass {s}'}" for r, s in d.passes.items() if s != usual]
    at = "; ".join(["idle" if usual is None else f"pass {usual}", *others])
    span = f"{d.clock}-{d.until}, {plural(d.points, 'point')}" if d.points > 1 else f"{d.clock}"
    return f"pass clock {span} ({at})" + (f" t={d.t_ns / 1e9:.3f} s" if d.t_ns is not None else "")


def _render_first(d: RankDiff, console: Console) -> None:
    console.print(f"[bold red]ranks differ[/] in group {d.group} at {_where(d)}")
    console.print(f"  {KIND_TEXT[d.kind]}")
    console.print(f"  differing: {' '.join(d.odd)}; reference: {' '.join(d.reference)}")
    table = compact_table(("field", "side", "values (ranks: value)"), shrink=("values (ranks: value)",))
    for f in d.fields:
        table.add_row(f.field, f.side, "; ".join(f"{','.join(v.ranks)}: {_value(v.value)}" for v in f.values))
    console.print(table)


def _render_dp(dp: DpReport, console: Console) -> None:
    table = compact_table(("t (s)", *(f"{r} q/run" for r in dp.ranks), "idle", "imbalance"), shrink=("idle",),
                          title=f"DP ranks side by side (queue / running, mean per pass; "
                                f"rows of {dp.bucket_ns / 1e9:g} s)")
    for row in dp.rows:
        cells = [f"{c.waiting_mean:.0f}/{c.running_mean:.0f}" if c.passes > c.idle else "-" for c in row.cells]
        table.add_row(f"{row.t_ns / 1e9:.1f}", *cells, " ".join(row.idle_ranks) or "-",
                      f"{row.running_imbalance:.2f}")
    console.print(table)
    lock = dp.lockstep
    if lock is not None:
        clocks = ", ".join(f"{r} {c}" for r, c in lock.clocks.items())
        state = "[bold red]out of lockstep[/]" if lock.broken else ("in lockstep" if lock.exact else
                                                                   "lower bounds (a rank was not closed cleanly)")
        console.print(f"pass clocks at the end ({state}, skew {lock.skew}): {clocks}")
    console.print("not in the trace: " + "; ".join(dp.not_in_trace))


def render(report: RanksReport, console: Console) -> None:
    labels = " ".join(r.rank for r in report.ranks)
    longest = max(r.clock for r in report.ranks)
    console.print(f"[bold]run {report.run}[/]: {plural(len(report.ranks), 'rank')} ({labels}), "
                  f"{MODE_TEXT[report.mode]}, {plural(longest, 'scheduler pass')}")
    for f in report.header_diffs:
        console.print(f"[red]headers differ[/]: {f.field}: "
                      + "; ".join(f"{','.join(v.ranks)}: {_value(v.value)}" for v in f.values))
    for g in report.groups:
        if len(g.ranks) > 1 and g.agree:
            console.print(f"group {g.group} ({' '.join(g.ranks)}): [green]agree[/] on every pass up to pass "
                          f"clock {g.compared_until}")
    if report.first is not None:
        _render_first(report.first, console)
    if report.later:
        console.print(f"[bold]later differences[/]: {report.later_total}"
                      + (f" (first {len(report.later)} listed)" if report.later_total > len(report.later) else ""))
        for d in report.later:
            fields = ", ".join(f.field for f in d.fields)
            console.print(f"  {_where(d)}: {d.kind}, {' '.join(d.odd)}: {fields}")
    if report.dp is not None:
        _render_dp(report.dp, console)
    for note in report.notes:
        console.print(f"note: {note}")


@click.command(short_help="Check that the ranks of one run made the same decisions.")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--run", "run_id", metavar="ID", help="The run to check, by its id or a prefix of it, when the "
              "files hold several.")
@json_option("the report")
@click.option("--rows", type=click.IntRange(min=1, max=1000), default=DEFAULT_ROWS, show_default=True,
              help="Rows of the DP side-by-side timeline.")
def ranks(paths: tuple[str, ...], run_id: str | None, json_out: str | None, rows: int) -> None:
    """Compare the scheduler ranks of one run pass by pass. Plain TP: every rank must decide the same;
    report the first pass where they differ, which ranks and fields, and whether the inputs already
    differed. DP attention: show the DP ranks side by side. PATH: trace files, directories or globs."""
    with open_traceset(paths) as traces:
        run = traces.run(run_id)
        if len(run.ranks) < 2:
            raise TraceSetError(run.ranks[0].path, f"run {run.label} has one rank ({run.ranks[0].label}) in "
                                "these files; give the trace of every rank")
        report = compare_ranks(run.ranks, run=run.label, rows=rows, notes=run.notes)
    if json_out is not None:
        write_json(json_out, dump_ranks(report))
    if json_out != STDOUT:
        render(report, summary_console())
    if report.verdict == "desync":
        raise click.exceptions.Exit(1)
