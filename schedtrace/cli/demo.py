"""``schedtrace demo``: record a real overload on CPU, replay it, and say what it found.

Steps: start the sandbox server under its model's overload with tracing on,
drive it with sglang's own benchmark client, stop it, run ``schedtrace info``
on each trace and ``schedtrace replay`` on the first one, in this process.
Then say in plain words what was checked. When the live run holds no
divergence (the usual case on a tiny CPU model), replay and bisect the shipped
sample that holds one, and say so. End with the ``schedtrace tui`` command.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from schedtrace.cli.sandbox_options import server_options, usable_trace_dir
from schedtrace.cli.style import plural
from schedtrace.tracer.contract.report import Report, load_report
from schedtrace.tracer.sandbox.load import LoadSpec, run_load
from schedtrace.tracer.sandbox.models import model as find_model
from schedtrace.tracer.sandbox.server import SandboxServer

TRACE_GLOB = "*.trace"
# The shipped sample with a real divergence (traces/README.md): the latch at pass 867.
SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "kv-pressure-lpm-24k.trace"
# The hybrids' forwards are slower: fewer, shorter prompts fill their 16k-token pools.
HYBRID_LOAD = LoadSpec(max_concurrency=24, input_len=1500, output_len=100)


def step(message: str) -> None:
    click.secho(f"==> {message}", bold=True)


def find_traces(trace_dir: Path) -> list[Path]:
    return sorted(p for p in trace_dir.rglob(TRACE_GLOB) if p.is_file())


def run_subcommand(args: list[str]) -> bool:
    """Run ``schedtrace ARGS`` in this process, errors printed as the console script does."""
    from schedtrace.cli import run

    return run(args) == 0


def findings(report: Report) -> list[str]:
    """What a replay report says, in plain words."""
    fid = report.fidelity
    lines = [
        f"fidelity: sglang's own scheduler code, re-driven from the trace under {report.old}, made the "
        f"recorded decision on {fid.matched} of {plural(fid.total, 'pass')}"
        + (" — the replay is faithful." if fid.matched == fid.total else " — see the mismatches in the report."),
    ]
    if report.divergences:
        first = report.divergences[0]
        fixes = ", ".join(first.fixes) or "no single fix"
        lines.append(
            f"divergences: {report.old} and {report.new} decide differently on "
            f"{plural(len(report.divergences), 'pass')}; the first is pass {first.pass_} "
            f"({', '.join(first.kinds)}), reproduced by {fixes} alone."
        )
    else:
        lines.append(f"divergences: none — {report.old} and {report.new} decide the same on every pass.")
    for arm in (report.old, report.new):
        stalls = report.stalls.get(arm, [])
        if stalls:
            spans = ", ".join(f"{s.start_pass}–{s.end_pass}" for s in stalls[:3])
            lines.append(f"stalls under {arm}: {len(stalls)} ({spans}): requests waited while sglang's "
                         "own admission check would have let the head in.")
    if not any(report.stalls.values()):
        lines.append("stalls: none in either arm (passes that admit nothing because the head does not fit "
                     "are back-pressure, not stalls).")
    for fix, note in sorted(report.fix_notes.items()):
        lines.append(f"{fix} on these hybrid pools: {note}")
    return lines


def say(lines: list[str]) -> None:
    for line in lines:
        click.echo(f"    {line}")


@click.command("demo", context_settings={"ignore_unknown_options": True},
               short_help="Record an overload on CPU, replay it, and say what it found.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/demo"), show_default=True,
              help="Directory for traces, logs, load results and the replay report.")
@click.option("--prompts", type=click.IntRange(1), default=LoadSpec.num_prompts, show_default=True,
              help="Requests bench_serving sends.")
@server_options
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED)
def demo(out_dir: Path, prompts: int, model: str, tp: int, dp: int, stand_in_forward: bool,
         launch_args: tuple[str, ...]) -> None:
    """Trace an overload of the real sglang server on CPU, replay it, and explain the result.

    Arguments after `--` go to sglang.launch_server after the model's overload
    flags (a later flag wins), e.g. `schedtrace demo -- --schedule-policy lpm`.
    """
    out_dir = out_dir.resolve()
    trace_dir = usable_trace_dir(out_dir / "traces")
    for path in find_traces(trace_dir):  # the demo owns this folder; old parts would mix with new ones
        path.unlink()
    entry = find_model(model)
    base = HYBRID_LOAD if entry.hybrid else LoadSpec()
    spec = LoadSpec(**{**base.__dict__, "num_prompts": prompts})
    failures: list[str] = []

    server = SandboxServer(model=model, tp=tp, dp=dp, stand_in_forward=stand_in_forward, overload=True,
                           trace_dir=trace_dir, extra_args=launch_args, log_path=out_dir / "server.log")
    step(f"starting sglang on CPU: {server.describe()}")
    click.echo(f"    launch flags: {' '.join(server.extra_args)}; tracing into {trace_dir}")
    with server:
        click.echo(f"    server ready at {server.url} in {server.start_seconds:.1f}s "
                   f"(pid {server.pid}, log {server.log_path})")
        step(f"load: sglang.bench_serving random-ids, {spec.num_prompts} prompts, "
             f"{spec.max_concurrency} concurrent, input {spec.input_len} ±{spec.range_ratio:.0%}, "
             f"output {spec.output_len}")
        result = run_load(server.url, spec, out_dir / "load", server.model_dir)
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
    browse = None
    if traces:
        report_path = out_dir / "replay.json"
        step(f"schedtrace replay {traces[0]} --json {report_path}")
        if run_subcommand(["replay", str(traces[0]), "--json", str(report_path)]):
            report = load_report(report_path)
            step("what the live run shows")
            say(findings(report))
            browse = (traces[0], report_path)
            if report.fidelity.matched != report.fidelity.total:
                failures.append("the stock replay did not reproduce every recorded decision")
            if not report.divergences and SAMPLE.is_file():
                browse = replay_sample(out_dir, failures) or browse
        else:
            failures.append("replay failed")

    if browse is not None:
        trace, report_path = browse
        step("browse it")
        click.echo(f"    .venv/bin/schedtrace tui {trace} --report {report_path}")
    if failures:
        click.secho("demo finished with problems: " + "; ".join(failures), fg="red")
        raise click.exceptions.Exit(1)
    click.secho(f"demo done; everything is in {out_dir}", fg="green")


def replay_sample(out_dir: Path, failures: list[str]) -> tuple[Path, Path] | None:
    """The live run found no divergence: show one on the shipped sample that holds one."""
    step(f"the live run held no divergence; replaying the shipped sample {SAMPLE.name}, which does")
    report_path = out_dir / "sample-replay.json"
    if not run_subcommand(["replay", str(SAMPLE), "--json", str(report_path)]):
        failures.append("replay of the sample failed")
        return None
    say(findings(load_report(report_path)))
    # The sample's latch holds an admittable head for one pass (867): a one-pass stall.
    step(f"schedtrace bisect {SAMPLE.name} --stall-passes 1: where the stall began and which fix removes it")
    if not run_subcommand(["bisect", str(SAMPLE), "--stall-passes", "1"]):
        click.echo("    (bisect exits 1 when it finds a stall, as a CI gate would)")
    return SAMPLE, report_path
