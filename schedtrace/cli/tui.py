"""``schedtrace tui``: browse one rank's trace, alone or with its replay.

The browser shows one rank: the first of the run, or ``--rank``'s. Its
background readers reopen the trace by file name, so a rank of several parts
is browsed from its first part only, with a warning.
"""

from __future__ import annotations

import click

from schedtrace.cli.options import chosen_ranks, old_new_options, one_rank_traces_argument
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.traceset import TraceSet


@click.command(short_help="Browse one rank's trace in the terminal, alone or with its replay.")
@one_rank_traces_argument
@click.option("--report", "report_path", metavar="REPLAY.json", help="A replay report (of this rank) to show.")
@old_new_options(old=None, new=None, why=" (replays the trace now)")
def tui(traces: TraceSet, rank: str | None, run_id: str | None, report_path: str | None, old: str | None,
        new: str | None) -> None:
    """Browse one rank of TRACE... in the terminal (the first rank, or --rank's): timeline, passes,
    divergences, requests."""
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.contract.report import load_report

    if report_path and (old or new):
        raise UsageError("use either --report or --old/--new, not both")
    if bool(old) != bool(new):
        raise UsageError("--old and --new go together")
    with traces:
        run, (chosen,) = chosen_ranks(traces, rank, run_id, first_only=True)
        if len(run.ranks) > 1 and rank is None:
            click.echo(f"schedtrace: note: browsing rank {chosen.label} of {len(run.ranks)} "
                       f"({', '.join(r.label for r in run.ranks)}); choose another with --rank", err=True)
        if len(chosen.parts) > 1:
            click.echo(f"schedtrace: warning: rank {chosen.label} has {len(chosen.parts)} parts; the browser "
                       f"reads one file, so it shows the first: {chosen.path}", err=True)
    # Open (and so check) both files before the terminal switches to the app:
    # a bad path or corrupt header is one line on stderr, not a screen.
    reader = TraceReader(chosen.path)
    try:
        report = load_report(report_path) if report_path else None

        from schedtrace.tui.app import TraceApp

        TraceApp(reader, report=report, arms=(old, new) if old and new else None).run()
    finally:
        reader.close()
