"""``schedtrace tui``: browse a trace, alone or with its replay."""

from __future__ import annotations

import click

from schedtrace.tracer.contract.errors import UsageError


@click.command()
@click.argument("trace")
@click.option("--report", "report_path", metavar="REPLAY.json", help="A replay report to show with the trace.")
@click.option("--old", help="Replay the trace now: the baseline arm (e.g. stock).")
@click.option("--new", help="Replay the trace now: the arm compared with it (e.g. fixed).")
def tui(trace: str, report_path: str | None, old: str | None, new: str | None) -> None:
    """Browse TRACE in the terminal: timeline, passes, divergences, requests."""
    from schedtrace.tracer.contract.report import load_report
    from schedtrace.tracer.contract.format import TraceReader

    if report_path and (old or new):
        raise UsageError("use either --report or --old/--new, not both")
    if bool(old) != bool(new):
        raise UsageError("--old and --new go together")
    if old and new:
        from schedtrace.replay.variants import parse_variant

        parse_variant(old)
        parse_variant(new)
    # Open (and so check) both files before the terminal switches to the app:
    # a bad path or corrupt header is one line on stderr, not a screen.
    reader = TraceReader(trace)
    report = load_report(report_path) if report_path else None

    from schedtrace.tui.app import TraceApp

    try:
        TraceApp(reader, report=report, arms=(old, new) if old and new else None).run()
    finally:
        reader.close()
