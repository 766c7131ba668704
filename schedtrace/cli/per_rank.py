"""What ``replay`` and ``bisect`` do with their reports, one per rank: the JSON, the summary, the exit.

One rank writes its own JSON; several write ``{"run": ID, "ranks": {...}}``
(``options.ranks_json``). Exit 1 when any rank trips the command's verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from schedtrace.cli.options import STDOUT, ranks_json, write_json
from schedtrace.cli.style import plural, summary_console
from schedtrace.tracer.contract.traceset import Run

R = TypeVar("R")


def write_reports(run: Run, reports: Mapping[str, R], json_out: str | None, dump: Callable[[R], bytes],
                  render: Callable[[R, Any], None]) -> None:
    """``--json`` (one rank: its own document) and, unless that went to stdout, each rank's summary."""
    if json_out is not None:
        write_json(json_out, dump(*reports.values()) if len(reports) == 1 else ranks_json(run, dict(reports)))
    if json_out != STDOUT:
        console = summary_console()
        for label, report in reports.items():
            if len(reports) > 1:
                console.rule(f"rank {label}")
            render(report, console)


def exit_if_tripped(reports: Mapping[str, R], tripped: Callable[[R], bool], what: str | None = None) -> None:
    """Exit 1 when ``tripped`` holds on any rank; ``what`` names the verdict on stderr."""
    labels = [label for label, report in reports.items() if tripped(report)]
    if not labels:
        return
    if what is not None:
        where = f" on {', '.join(labels)}" if len(reports) > 1 else ""
        click.echo(f"schedtrace: {what}: tripped{where}", err=True)
    raise click.exceptions.Exit(1)


def retry_note(retried: int) -> str | None:
    """The summary's line for tasks a distributed backend ran again (None: there were none)."""
    if not retried:
        return None
    return f"Ray ran {plural(retried, 'task')} again after a worker died; each counted once"
