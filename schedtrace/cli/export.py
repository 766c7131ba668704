"""``schedtrace export``: recorded traces to Perfetto (Chrome JSON), to an OTLP collector, or
their workload to a Mooncake trace.

Chrome: every rank of the run (or ``--rank``'s) in one file, a process each,
on one wall-clock timeline. OTLP: each rank's spans in turn, each rank its
own resource. Mooncake: one JSON line per request of every rank (or
``--rank``'s), a request seen on several ranks once.
"""

from __future__ import annotations

from pathlib import Path

import click

from schedtrace.cli.options import STDOUT, atomic_output, chosen_ranks, stall_passes_option, traces_argument
from schedtrace.cli.style import plural
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.traceset import RankTrace, TraceSet


@click.command(short_help="Export traces for Perfetto UI, an OpenTelemetry collector or a Mooncake workload.")
@traces_argument
@click.option("--format", "fmt", type=click.Choice(["chrome", "otlp", "mooncake"]), required=True,
              help="chrome: Trace Event Format JSON for Perfetto UI; otlp: spans over OTLP/HTTP protobuf; "
              "mooncake: the requests as a Mooncake trace (JSON lines) for bench_serving and other load tools.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True),
              help="chrome, mooncake: output file ('-' for stdout; default the first TRACE with "
              ".chrome.json or .mooncake.jsonl).")
@click.option("--endpoint", help="otlp: collector URL (default: OTEL_EXPORTER_OTLP_*ENDPOINT, "
              "else http://localhost:4318/v1/traces; a URL without a path gets /v1/traces).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="A replay report (schedtrace replay --json) of one rank whose divergences and stalls to include.")
@click.option("--block-size", type=click.IntRange(min=1), default=None, metavar="TOKENS",
              help="mooncake: input tokens per hash id, a multiple of the trace's block (default: Mooncake's 512).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1, max=120), default=10.0, show_default=True,
              help="otlp: seconds per batch, retries included, before giving up.")
@stall_passes_option()
def export(traces: TraceSet, rank: str | None, run_id: str | None, fmt: str, output: str | None,
           endpoint: str | None, report_path: str | None, block_size: int | None, timeout_s: float,
           stall_passes: int) -> None:
    """Export TRACE... (files, globs or directories; every rank, or --rank's) for Perfetto UI
    (--format chrome) or an OpenTelemetry collector (--format otlp).

    Without --report, chrome marks the stalls of the recorded decisions
    (--stall-passes); with it, the report's own stalls and divergences. A
    report made from another trace is refused.
    """
    from schedtrace.tracer.contract.report import load_report
    from schedtrace.tracer.contract.report_check import check_report

    if fmt != "otlp" and endpoint:
        raise UsageError("--endpoint applies to --format otlp only")
    if fmt == "otlp" and output:
        raise UsageError("-o/--output applies to --format chrome and mooncake only")
    if fmt == "mooncake" and report_path:
        raise UsageError("--report applies to --format chrome and otlp only")
    if fmt != "mooncake" and block_size is not None:
        raise UsageError("--block-size applies to --format mooncake only")
    with traces:
        _, ranks = chosen_ranks(traces, rank, run_id)
        if report_path and len(ranks) > 1:
            raise UsageError(f"--report covers one rank; these files hold {len(ranks)} "
                             f"({', '.join(r.label for r in ranks)}): choose one with --rank")
        report = load_report(report_path) if report_path else None
        if report is not None:  # another trace's report is refused, in one line (exit 2), before any output
            check_report(report, ranks[0], report_path)
        if fmt == "chrome":
            _export_chrome(ranks, output, report, stall_passes)
        elif fmt == "mooncake":
            _export_mooncake(ranks, output, block_size)
        else:
            _export_otlp(ranks, endpoint, report, timeout_s)
        for r in ranks:
            if r.truncated_at is not None:
                click.echo(f"schedtrace: warning: {r.path} was not closed cleanly; exported the records "
                           f"before offset {r.truncated_at}", err=True)
            if report is not None and report.passes != r.pass_count:
                click.echo(f"schedtrace: warning: {report_path} covers {report.passes} passes, "
                           f"{r.path} has {r.pass_count}", err=True)


def _export_chrome(ranks: tuple[RankTrace, ...], output: str | None, report, stall_passes: int) -> None:
    from schedtrace.tracer.export.chrome import export_chrome, export_chrome_ranks

    target = output or str(Path(ranks[0].path).with_suffix(".chrome.json"))
    with atomic_output(target) as out:
        if len(ranks) == 1:
            stats = export_chrome(ranks[0], out, report, stall_passes=stall_passes)
        else:
            stats = export_chrome_ranks(ranks, out, stall_passes=stall_passes)
    if target != STDOUT:
        events = ", ".join(f"{n} {ph}" for ph, n in sorted(stats.events.items()))
        who = f" of {plural(len(ranks), 'rank')}" if len(ranks) > 1 else ""
        click.echo(f"{target}: {stats.passes} passes{who} ({events}); open it in https://ui.perfetto.dev", err=True)


def _export_mooncake(ranks: tuple[RankTrace, ...], output: str | None, block_size: int | None) -> None:
    from schedtrace.tracer.analysis.workload import read_workload
    from schedtrace.tracer.export.mooncake import block_size_for, mooncake_lines

    workload = read_workload(ranks)  # read whole before the file is opened: a bad trace leaves no output
    block = block_size_for(workload, block_size)
    target = output or str(Path(ranks[0].path).with_suffix(".mooncake.jsonl"))
    with atomic_output(target) as out:
        out.writelines(mooncake_lines(workload, block))
    if not workload.shared_prefixes:
        click.echo(f"schedtrace: warning: {ranks[0].path} holds no prefix ids (an older recorder): every "
                   "block has a hash id of its own, shared with no other request", err=True)
    if target != STDOUT:
        aborted = sum(r.client_aborted for r in workload.requests)
        click.echo(f"{target}: {plural(len(workload.requests), 'request')} ({aborted} aborted by the client), "
                   f"hash ids per {block} tokens", err=True)


def _export_otlp(ranks: tuple[RankTrace, ...], endpoint: str | None, report, timeout_s: float) -> None:
    try:
        from schedtrace.tracer.export.otlp import export_otlp, resolve_endpoint
    except ImportError as exc:  # the SDK and exporter are the optional "otel-export" extra
        raise UsageError(f"--format otlp needs the OpenTelemetry SDK: pip install 'schedtrace[otel-export]' "
                         f"({exc})") from None

    url = resolve_endpoint(endpoint)
    for r in ranks:
        stats = export_otlp(r, url, report, timeout_s=timeout_s)
        extra = (f", {plural(stats.divergence_events, 'divergence event')} and "
                 f"{plural(stats.stall_events, 'stall event')}") if report else ""
        who = f"{r.label}: " if len(ranks) > 1 else ""
        click.echo(f"{url}: {who}sent {stats.pass_spans} pass spans ({stats.spans} spans in {stats.batches} "
                   f"batches{extra})", err=True)
