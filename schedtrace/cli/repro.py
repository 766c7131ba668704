"""``schedtrace repro TRACE --pass N | --stall K``: a small pytest test for a divergence or a stall.

The test is shrunk first (delta debugging, every step checked with the real
sglang code), then run in pytest processes on stock and with each fix
alone; it is written only if it fails on stock and passes with its fix
(``schedtrace.replay.repro``). Exit codes: 0 written, 2 usage or input error,
or no verified test (one line on stderr, no traceback; see schedtrace.cli).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from schedtrace.cli.options import DEFAULT_JOBS, VARIANT, stall_passes_option, trace_argument
from schedtrace.cli.progress import Activity
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import STOCK
from schedtrace.tracer.contract.report import DIVERGENCE_KINDS

if TYPE_CHECKING:
    from rich.console import Console

    from schedtrace.replay.repro.pipeline import Verdict


def default_output(trace: Path, what: str) -> Path:
    stem = re.sub(r"\W+", "_", trace.stem).strip("_")
    return Path(f"test_{stem}_{what}.py")


def render_verdict(verdict: Verdict, console: Console) -> None:
    console.print("verified: SCHEDTRACE_FIXES=VARIANT python -m pytest, one process per variant")
    table = compact_table(("variant", "test", "replay predicts"))
    for run in verdict.runs:
        mark = "  [bold]← its fix[/]" if run.variant == verdict.own else ""
        table.add_row(run.variant, run.outcome + mark, verdict.predicted[run.variant])
    console.print(table)
    console.print(f"[green]fails on base, passes with the fix[/]: {verdict.own}")


def _write(text: str, target: Path) -> None:
    try:
        target.write_text(text)
    except OSError as exc:
        raise UsageError(f"{target}: cannot write: {exc.strerror}") from None


def _repro_pass(trace: Path, pass_n: int, kind: str | None, fix: str | None, output: Path, jobs: int,
                console: Console) -> None:
    from schedtrace.replay.repro.emit import function_name
    from schedtrace.replay.repro.pipeline import build, predict, verify

    with Activity() as activity:
        activity.import_sglang()
        activity.phase(f"finding and shrinking the divergence at pass {pass_n}")
        repro = build(trace, pass_n, kind=kind, fix=fix)
    for case in repro.cases:
        d = case.divergent
        where = f"aiter event after pass {d.pass_}" if d.is_aiter else f"pass {d.pass_}"
        console.print(f"{trace} {where}: {', '.join(d.kinds)}; fixed by {d.fixes}")
        console.print(f"  shrunk: {case.shrunk}")
        console.print(f"  test: {function_name(case)}")
    console.print(f"  {plural(repro.calls, 'real-code call')} to find and shrink")
    with tempfile.TemporaryDirectory(prefix="schedtrace-repro-") as tmp:
        module = Path(tmp) / output.name
        module.write_text(repro.text)
        with Activity() as activity:
            activity.phase("verifying in pytest processes")
            verdict = verify(module, predict(repro), repro.fixes, jobs=jobs)
    render_verdict(verdict, console)
    _write(repro.text, output)
    console.print(f"wrote {output}")


def _repro_stall(trace: Path, onset: int, fix: str | None, output: Path, stall_passes: int, jobs: int,
                 console: Console) -> None:
    from schedtrace.replay.repro.pipeline import variants_for, verify
    from schedtrace.replay.repro.stall import (describe_stall, emit_stall_module, find_stall, minimize,
                                               predict_stall, write_minimal)

    trace_out = output.with_suffix(".trace")
    with Activity() as activity:
        activity.import_sglang()
        activity.phase(f"bisecting and minimising the stall at pass {onset}")
        case = find_stall(trace, onset, stall_passes=stall_passes, fix=fix)
        found = minimize(case)
    console.print(f"{trace} stall from pass {onset} ({case.finding.mode}): removed by {case.fixes}")
    console.print(f"  minimal trace: {describe_stall(case, found)} ({plural(found.closed_loops, 'closed loop')} run)")
    text = emit_stall_module(case, found, trace_out.name)
    with tempfile.TemporaryDirectory(prefix="schedtrace-repro-") as tmp:
        module, minimal = Path(tmp) / output.name, Path(tmp) / trace_out.name
        module.write_text(text)
        write_minimal(case, found.keep, minimal)
        with Activity() as activity:
            activity.phase("verifying in pytest processes")
            predicted = predict_stall(minimal, case, variants_for(case.fixes))
            verdict = verify(module, predicted, case.fixes, jobs=jobs, extra_files=(minimal,))
        render_verdict(verdict, console)
        write_minimal(case, found.keep, trace_out)
    _write(text, output)
    console.print(f"wrote {output} and {trace_out}")


@click.command(short_help="Turn a divergence or a stall into a small test that fails on stock sglang.")
@trace_argument
@click.option("--pass", "pass_n", type=click.IntRange(min=0), metavar="N",
              help="The divergence at this pass (divergences[].pass of the replay report).")
@click.option("--stall", "stall_onset", type=click.IntRange(min=0), metavar="K",
              help="The stock stall that starts at this pass (as schedtrace bisect lists it).")
@click.option("--kind", type=click.Choice(DIVERGENCE_KINDS),
              help="Only the divergence of this kind (aiter: the aiter event after the pass).")
@click.option("--fix", type=VARIANT, metavar="NAME",
              help="The fix the test is for (default: the one that causes the divergence, or bisect's set).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Where to write the test (default: test_<trace>_pass<N>.py here).")
@stall_passes_option()
@click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, metavar="N", show_default=True,
              help="pytest processes run at a time to verify the test.")
def repro(trace: Path, pass_n: int | None, stall_onset: int | None, kind: str | None, fix: str | None,
          output: Path | None, stall_passes: int, jobs: int) -> None:
    """Write a pytest test for the divergence at pass N (or the stall from pass K) of TRACE.

    It is shrunk to the smallest state that still diverges, checked with the
    real sglang code at every step, and written only after it failed on stock
    and passed with its fix in fresh pytest processes.
    """
    if (pass_n is None) == (stall_onset is None):
        raise UsageError("give exactly one of --pass N and --stall K")
    if fix is not None and fix.strip() == STOCK:
        raise UsageError("--fix stock: name the fix the test is for")
    if stall_onset is not None and kind is not None:
        raise UsageError("--kind chooses among the divergences of a pass; a stall has none")
    console = summary_console()
    if pass_n is not None:
        target = output or default_output(trace, f"pass{pass_n}")
        _repro_pass(trace, pass_n, kind, fix, target, jobs, console)
    else:
        target = output or default_output(trace, f"stall{stall_onset}")
        _repro_stall(trace, stall_onset, fix, target, stall_passes, jobs, console)
