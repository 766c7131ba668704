"""``schedtrace demo``: record a real overload on CPU, then inspect and replay it.

Steps: start the sandbox server under KV pressure with tracing on, drive it
with sglang's own benchmark client, stop it, then run ``schedtrace info`` on
each trace and ``schedtrace replay`` on the first one, in this process.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from schedtrace.tracer.sandbox.load import LoadSpec, run_load
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer

TRACE_GLOB = "*.trace"


def step(message: str) -> None:
    click.secho(f"==> {message}", bold=True)


def find_traces(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.rglob(TRACE_GLOB) if p.is_file())


def run_subcommand(args: list[str]) -> bool:
    """Run ``schedtrace ARGS`` in this process, errors printed as the console script does."""
    from schedtrace.cli import run

    return run(args) == 0


@click.command("demo", context_settings={"ignore_unknown_options": True},
               short_help="Record an overload on CPU, then summarize and replay it.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/demo"), show_default=True,
              help="Directory for traces, logs, load results and the replay report.")
@click.option("--prompts", type=click.IntRange(1), default=LoadSpec.num_prompts, show_default=True,
              help="Requests bench_serving sends.")
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED)
def demo(out_dir: Path, prompts: int, launch_args: tuple[str, ...]) -> None:
    """Trace a KV-pressure overload of the real sglang server on CPU, then replay it.

    Arguments after `--` go to sglang.launch_server after the overload flags
    (a later flag wins), e.g. `schedtrace demo -- --schedule-policy lpm`.
    """
    out_dir = out_dir.resolve()
    trace_dir = out_dir / "traces"
    trace_dir.mkdir(parents=True, exist_ok=True)
    stale = find_traces(trace_dir)
    for path in stale:  # the demo owns this folder; old parts would mix with new ones
        path.unlink()
    spec = LoadSpec(num_prompts=prompts)
    failures: list[str] = []

    server_args = [*KV_PRESSURE_ARGS, *launch_args]
    step(f"starting sglang on CPU with {' '.join(server_args)}, tracing into {trace_dir}")
    server = SandboxServer(trace_dir=trace_dir, extra_args=server_args,
                           log_path=out_dir / "server.log")
    with server:
        click.echo(f"    server ready at {server.url} in {server.start_seconds:.1f}s "
                   f"(pid {server.pid}, log {server.log_path})")
        step(f"load: sglang.bench_serving random-ids, {spec.num_prompts} prompts, "
             f"{spec.max_concurrency} concurrent, input {spec.input_len} ±{spec.range_ratio:.0%}, "
             f"output {spec.output_len}")
        result = run_load(server.url, spec, out_dir / "load")
        click.echo(f"    {result.summary()}")
        if result.failed:
            failures.append(f"{result.failed} of {result.num_prompts} requests failed")
        step("stopping the server")
        started = time.monotonic()
    click.echo(f"    stopped in {time.monotonic() - started:.1f}s")

    traces = find_traces(trace_dir)
    if not traces:
        click.echo(f"    no trace was written in {trace_dir}: is the recorder plugin installed "
                   "(`pip install -e .` registers the `sglang.srt.plugins` entry point)?")
        failures.append("no trace written")
    for path in traces:
        step(f"schedtrace info {path}")
        if not run_subcommand(["info", str(path)]):
            failures.append(f"info failed on {path.name}")
    if traces:
        report = out_dir / "replay.json"
        step(f"schedtrace replay {traces[0]} --json {report}")
        if not run_subcommand(["replay", str(traces[0]), "--json", str(report)]):
            failures.append("replay failed")

    if failures:
        click.secho("demo finished with problems: " + "; ".join(failures), fg="red")
        raise click.exceptions.Exit(1)
    click.secho(f"demo done; everything is in {out_dir}", fg="green")
