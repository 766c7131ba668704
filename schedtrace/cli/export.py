"""``schedtrace export``: a recorded trace to Perfetto (Chrome JSON) or to an OTLP collector."""

from __future__ import annotations

from pathlib import Path

import click

from schedtrace.cli.options import STDOUT, atomic_output, stall_passes_option, trace_argument
from schedtrace.cli.style import plural
from schedtrace.tracer.contract.errors import UsageError


@click.command(short_help="Export a trace for Perfetto UI or an OpenTelemetry collector.")
@trace_argument
@click.option("--format", "fmt", type=click.Choice(["chrome", "otlp"]), required=True,
              help="chrome: Trace Event Format JSON for Perfetto UI; otlp: spans over OTLP/HTTP protobuf.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
              help="chrome: output file ('-' for stdout; default TRACE with .chrome.json).")
@click.option("--endpoint", help="otlp: collector URL (default: OTEL_EXPORTER_OTLP_*ENDPOINT, "
              "else http://localhost:4318/v1/traces; a URL without a path gets /v1/traces).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="A replay report (schedtrace replay --json) whose divergences and stalls to include.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=120), default=10.0, show_default=True,
              help="otlp: seconds per batch, retries included, before giving up.")
@stall_passes_option()
def export(trace: Path, fmt: str, output: str | None, endpoint: str | None, report_path: str | None,
           timeout_s: float, stall_passes: int) -> None:
    """Export TRACE for Perfetto UI (--format chrome) or an OpenTelemetry collector (--format otlp).

    Without --report, chrome marks the stalls of the recorded decisions
    (--stall-passes); with it, the report's own stalls and divergences.
    """
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.contract.report import load_report

    if fmt == "chrome" and endpoint:
        raise UsageError("--endpoint applies to --format otlp only")
    if fmt == "otlp" and output:
        raise UsageError("-o/--output applies to --format chrome only")
    report = load_report(report_path) if report_path else None
    with TraceReader(trace) as reader:
        if fmt == "chrome":
            _export_chrome(reader, output, report, stall_passes)
        else:
            _export_otlp(reader, endpoint, report, timeout_s)
        if reader.truncated_at is not None:
            click.echo(f"schedtrace: warning: {trace} was not closed cleanly; exported the records "
                       f"before offset {reader.truncated_at}", err=True)
        if report is not None and report.passes != reader.pass_count:
            click.echo(f"schedtrace: warning: {report_path} covers {report.passes} passes, "
                       f"{trace} has {reader.pass_count}", err=True)


def _export_chrome(reader, output: str | None, report, stall_passes: int) -> None:
    from schedtrace.tracer.export.chrome import export_chrome

    target = output or str(Path(reader.path).with_suffix(".chrome.json"))
    with atomic_output(target) as out:
        stats = export_chrome(reader, out, report, stall_passes=stall_passes)
    if target != STDOUT:
        events = ", ".join(f"{n} {ph}" for ph, n in sorted(stats.events.items()))
        click.echo(f"{target}: {stats.passes} passes ({events}); open it in https://ui.perfetto.dev", err=True)


def _export_otlp(reader, endpoint: str | None, report, timeout_s: float) -> None:
    try:
        from schedtrace.tracer.export.otlp import export_otlp, resolve_endpoint
    except ImportError as exc:  # the SDK and exporter are the optional "otel-export" extra
        raise UsageError(f"--format otlp needs the OpenTelemetry SDK: pip install 'schedtrace[otel-export]' "
                         f"({exc})") from None

    url = resolve_endpoint(endpoint)
    stats = export_otlp(reader, url, report, timeout_s=timeout_s)
    extra = (f", {plural(stats.divergence_events, 'divergence event')} and "
             f"{plural(stats.stall_events, 'stall event')}") if report else ""
    click.echo(f"{url}: sent {stats.pass_spans} pass spans ({stats.spans} spans in {stats.batches} batches{extra})",
               err=True)

