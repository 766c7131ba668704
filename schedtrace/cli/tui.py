"""``schedtrace tui``: browse a trace, alone or with its replay."""

from __future__ import annotations

from pathlib import Path

import click

from schedtrace.cli.options import old_new_options, trace_argument
from schedtrace.tracer.contract.errors import UsageError


@click.command(short_help="Browse a trace in the terminal, alone or with its replay.")
@trace_argument
@click.option("--report", "report_path", metavar="REPLAY.json", help="A replay report to show with the trace.")
@old_new_options(old=None, new=None, why=" (replays the trace now)")
def tui(trace: Path, report_path: str | None, old: str | None, new: str | None) -> None:
    """Browse TRACE in the terminal: timeline, passes, divergences, requests."""
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.contract.report import load_report

    if report_path and (old or new):
        raise UsageError("use either --report or --old/--new, not both")
    if bool(old) != bool(new):
        raise UsageError("--old and --new go together")
    # Open (and so check) both files before the terminal switches to the app:
    # a bad path or corrupt header is one line on stderr, not a screen.
    reader = TraceReader(trace)
    try:
        report = load_report(report_path) if report_path else None

        from schedtrace.tui.app import TraceApp

        TraceApp(reader, report=report, arms=(old, new) if old and new else None).run()
    finally:
        reader.close()
