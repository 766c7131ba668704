"""``schedtrace sandbox``: run the embedded CPU sglang server until stopped."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from schedtrace.tracer.contract.errors import SandboxError
from schedtrace.cli.sandbox_options import server_options, usable_trace_dir
from schedtrace.tracer.sandbox.server import SandboxServer, read_log_tail

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@click.command(
    "sandbox",
    short_help="Serve the tiny model with the real sglang server on CPU.",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--trace-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Record scheduler traces here (sets SCHEDTRACE_DIR for the server).")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1 (default: a free one).")
@click.option("--fixes", default=None, metavar="LIST",
              help="Live scheduler fixes and arm files, e.g. 'all', 'latch,one-chunk' or './mine.diff' "
              "(an sglang diff or an edits .py; sets SCHEDTRACE_FIXES).")
@server_options
@click.option("--overload", is_flag=True,
              help="The model's KV-pressure settings (chunked prefill, a tight pool, few slots).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Server log file (default: a new temporary directory).")
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED)
def sandbox(
    trace_dir: Path | None,
    port: int | None,
    fixes: str | None,
    model: str,
    tp: int,
    dp: int,
    pp: int,
    stand_in_forward: bool,
    overload: bool,
    log_path: Path | None,
    launch_args: tuple[str, ...],
) -> None:
    """Serve the tiny model with the real sglang server on CPU until Ctrl-C.

    Arguments after `--` go to `python -m sglang.launch_server` unchanged.
    """
    trace_dir = usable_trace_dir(trace_dir)
    server = SandboxServer(model=model, tp=tp, dp=dp, pp=pp, stand_in_forward=stand_in_forward, overload=overload,
                           trace_dir=trace_dir, port=port, fixes=fixes, extra_args=launch_args,
                           log_path=log_path)
    stop_requested = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop_requested.set()) for sig in STOP_SIGNALS}
    click.echo(f"starting sglang on CPU at {server.url}: {server.describe()} (log: {server.log_path}) ...",
               err=True)
    try:
        server.start()
        click.echo(f"ready in {server.start_seconds:.1f}s; pid {server.pid}", err=True)
        if trace_dir is not None:
            click.echo(f"tracing into {server.trace_dir}", err=True)
        click.echo(server.url)  # stdout carries just the URL, for scripts
        click.echo("press Ctrl-C to stop", err=True)
        while not stop_requested.wait(0.5):
            if not server.running:
                raise SandboxError(
                    f"sglang server exited unexpectedly; log {server.log_path}, last lines:\n"
                    + read_log_tail(server.log_path)
                )
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping the sandbox server ...", err=True)
        # A second Ctrl-C must not cut the stop short and orphan the children.
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            server.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    click.echo("stopped", err=True)
