"""``schedtrace tui``: browse a run's traces in the terminal, rank by rank, alone or with a replay.

Every rank of the run is browsable (``[`` and ``]`` switch); it starts on the
first, or on ``--rank``'s. A rank's parts are read as one trace, and a
damaged file is read past its gaps, which the browser lists and marks. A
replay (``--report``, ``--old/--new``) is of the rank it starts on.
"""

from __future__ import annotations

import click

from schedtrace.cli.options import chosen_ranks, old_new_options, one_rank_traces_argument, stall_passes_option
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.traceset import TraceSet


@click.command(short_help="Browse a run's traces in the terminal, rank by rank, alone or with its replay.")
@one_rank_traces_argument
@click.option("--report", "report_path", metavar="REPLAY.json",
              help="A replay report (of the rank shown first) to show.")
@old_new_options(old=None, new=None, why=" (replays the rank shown first now)")
@stall_passes_option()
def tui(traces: TraceSet, rank: str | None, run_id: str | None, report_path: str | None, old: str | None,
        new: str | None, stall_passes: int) -> None:
    """Browse the ranks of TRACE... in the terminal (from the first, or --rank's; [ and ] switch):
    timeline, passes, divergences, desyncs between ranks, gaps, requests."""
    from schedtrace.tracer.contract.report import load_report
    from schedtrace.tui.model.rank_set import RankSet, open_rank

    if report_path and (old or new):
        raise UsageError("use either --report or --old/--new, not both")
    if bool(old) != bool(new):
        raise UsageError("--old and --new go together")
    with traces:
        run, (chosen,) = chosen_ranks(traces, rank, run_id, first_only=True)
        # Open (and so check) the trace and the report before the terminal switches to the app:
        # a bad path or corrupt header is one line on stderr, not a screen.
        reader = open_rank(chosen)
        try:
            report = load_report(report_path) if report_path else None

            from schedtrace.tui.app import TraceApp

            TraceApp(reader, report=report, arms=(old, new) if old and new else None, stall_passes=stall_passes,
                     ranks=RankSet(run.label, run.ranks), rank=run.ranks.index(chosen)).run()
        finally:
            reader.close()
