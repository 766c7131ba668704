"""``schedtrace redrive``: send a trace's recorded workload again to an sglang server.

The sending is ``schedtrace.tracer.sandbox.redrive``; this reads the trace
set, asks the server its vocabulary, draws the bar and says what happened.
Exit 0 when every request completed or aborted as recorded, 1 when one
failed or the server refused or stopped answering (one line naming the URL),
2 for a bad trace or option.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import click

from schedtrace.cli import error_line
from schedtrace.cli.options import chosen_ranks, json_option, traces_argument, write_json
from schedtrace.tracer.contract.errors import EndpointUnreachableError
from schedtrace.tracer.contract.traceset import TraceSet


@click.command(short_help="Send a trace's recorded workload again to an sglang server.")
@traces_argument
@click.option("--url", required=True, help="The sglang server, http://HOST:PORT.")
@click.option("--speedup", type=click.FloatRange(min=0.001, max=1000), default=1.0, show_default=True,
              help="Send this many times faster than recorded (0.5: half speed).")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N",
              help="Send only the first N requests.")
@click.option("--vocab", type=click.IntRange(min=4), default=None, metavar="N",
              help="The server's vocabulary size (default: its model folder's config.json).")
@click.option("--rid-prefix", default=None, metavar="TEXT",
              help="Request ids are TEXT plus the request's number (default: redrive-RANDOM-).")
@json_option("every request's outcome")
def redrive(traces: TraceSet, rank: str | None, run_id: str | None, url: str, speedup: float, limit: int | None,
            vocab: int | None, rid_prefix: str | None, json_out: str | None) -> None:
    """Send the requests TRACE... recorded (every rank's, or --rank's) to the sglang server at
    --url through /generate: each with its input length, its shared prefixes (token ids made
    from the trace's prefix ids), its produced output length with ignore_eos and its
    priority, at its recorded arrival time divided by --speedup, open loop; recorded client
    aborts drop the connection at their time.
    """
    from schedtrace.cli.progress import Activity
    from schedtrace.tracer.analysis.workload import read_workload
    from schedtrace.tracer.sandbox.redrive import FAILED, check_reachable, plan, redrive as send, server_vocab

    with traces:
        _, ranks = chosen_ranks(traces, rank, run_id)
        workload = read_workload(ranks)
        source = ranks[0].path
    if not workload.shared_prefixes:
        click.echo(f"schedtrace: warning: {source} holds no prefix ids (an older recorder): "
                   "the requests share no prefix", err=True)
    planned = plan(workload, speedup=speedup, limit=limit,
                   rid_prefix=rid_prefix if rid_prefix is not None else f"redrive-{secrets.token_hex(4)}-")
    try:
        size = server_vocab(url, vocab)
        span = planned[-1].send_at_s if planned else 0.0
        click.echo(f"{url}: sending {len(planned)} requests of {Path(source).name} over {span:.1f}s "
                   f"(vocabulary {size}, speed-up {speedup:g})", err=True)
        with Activity() as activity:
            result = send(url, planned, workload.block, size, activity.requests("re-driving"))
        if json_out is not None:
            import msgspec

            write_json(json_out, msgspec.json.format(msgspec.json.encode(
                {"url": url, "summary": result.summary(), "outcomes": result.outcomes}), indent=2) + b"\n")
        check_reachable(result)
    except EndpointUnreachableError as exc:
        click.echo(error_line(str(exc)), err=True)
        raise click.exceptions.Exit(1) from None
    click.echo(result.summary())
    failed = [o for o in result.outcomes if o.status == FAILED]
    for outcome in failed[:5]:
        click.echo(f"  failed: {outcome.rid}: {outcome.detail}", err=True)
    if failed:
        raise click.exceptions.Exit(1)
