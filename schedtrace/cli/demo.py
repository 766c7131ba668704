"""``schedtrace demo``: reproduce a stall live on CPU, under stock and under the fixes, and say what it found.

On the tiny Llama (the default) the demo re-drives a shipped workload
(``WORKLOAD``, traces/README.md) twice, each time on a fresh sandbox server
with the recording's scheduling flags and tracing on: once stock, once with
the four fixes installed live (``SCHEDTRACE_FIXES=all``). It replays each
run's trace and shows the live A/B: where the fixed logic would have decided
otherwise on the stock run (divergences) and the stalls, against a fixed run
whose every decision the fixed logic reproduces. ``--bench-serving`` (and the
hybrid models) records a bench_serving overload instead, as before.

When a live run holds no divergence, the demo says so, then replays and
bisects the shipped sample that holds one. It ends with the ``schedtrace
tui`` command.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from schedtrace.cli.sandbox_options import server_options, usable_trace_dir
from schedtrace.cli.style import plural
from schedtrace.tracer.contract.names import FIXED, STOCK
from schedtrace.tracer.contract.report import Report, load_report
from schedtrace.tracer.sandbox.load import LoadSpec, run_load
from schedtrace.tracer.sandbox.models import DEFAULT_MODEL, model as find_model
from schedtrace.tracer.sandbox.server import SandboxServer

TRACE_GLOB = "*.trace"
TRACES = Path(__file__).resolve().parents[2] / "traces"
# The shipped sample with a real divergence (traces/README.md): the latch at pass 867.
SAMPLE = TRACES / "kv-pressure-lpm-24k.trace"
# The shipped workload the live A/B re-drives: a client abort leaves a latched queue stalled under stock.
WORKLOAD = TRACES / "latch-abort-live.trace"
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
               short_help="Reproduce a stall live on CPU, stock and fixed, replay it, and say what it found.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/demo"), show_default=True,
              help="Directory for traces, logs, load results and the replay reports.")
@click.option("--workload", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=WORKLOAD,
              show_default=True, help="The recorded workload the live A/B re-drives (the tiny Llama only).")
@click.option("--bench-serving", is_flag=True,
              help="Record one bench_serving overload instead of the live A/B (the hybrid models always do).")
@click.option("--prompts", type=click.IntRange(1), default=LoadSpec.num_prompts, show_default=True,
              help="Requests bench_serving sends (--bench-serving).")
@server_options
@click.argument("launch_args", nargs=-1, type=click.UNPROCESSED)
def demo(out_dir: Path, workload: Path, bench_serving: bool, prompts: int, model: str, tp: int, dp: int,
         pp: int, stand_in_forward: bool, launch_args: tuple[str, ...]) -> None:
    """Reproduce a stall of the real sglang server live on CPU, under stock and under the fixes,
    replay both runs, and explain the result.

    Arguments after `--` go to sglang.launch_server after the recording's (or,
    with --bench-serving, the model's overload) flags (a later flag wins), e.g.
    `schedtrace demo --bench-serving -- --schedule-policy lpm`.
    """
    if not bench_serving and model == DEFAULT_MODEL and tp == dp == pp == 1 and not stand_in_forward:
        return live_ab(out_dir.resolve(), workload, launch_args)
    out_dir = out_dir.resolve()
    trace_dir = usable_trace_dir(out_dir / "traces")
    for path in find_traces(trace_dir):  # the demo owns this folder; old parts would mix with new ones
        path.unlink()
    entry = find_model(model)
    base = HYBRID_LOAD if entry.hybrid else LoadSpec()
    spec = LoadSpec(**{**base.__dict__, "num_prompts": prompts})
    failures: list[str] = []

    server = SandboxServer(model=model, tp=tp, dp=dp, pp=pp, stand_in_forward=stand_in_forward, overload=True,
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

    finish(browse, failures, out_dir)


def finish(browse: tuple[Path, Path] | None, failures: list[str], out_dir: Path) -> None:
    """The tui command for what to browse, then done or the problems (exit 1)."""
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


def live_ab(out_dir: Path, workload_path: Path, launch_args: tuple[str, ...]) -> None:
    """Re-drive the recorded workload on a stock and on a fixed server; replay both runs' traces."""
    from schedtrace.cli.progress import Activity
    from schedtrace.tracer.analysis.workload import read_workload
    from schedtrace.tracer.contract.errors import EndpointUnreachableError, SchedtraceError
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.sandbox.ab import launch_args_for, redrive_arm

    with TraceReader(workload_path) as reader:
        workload = read_workload([reader])
        recorded_args = launch_args_for(reader.header.server_args)
    flags = (*recorded_args, *launch_args)
    aborted = sum(r.client_aborted for r in workload.requests)
    span = workload.requests[-1].t_ms / 1000 if workload.requests else 0.0
    failures: list[str] = []
    runs = {}
    traces = usable_trace_dir(out_dir / "traces")
    for arm in (STOCK, FIXED):
        work, trace_dir = out_dir / arm, usable_trace_dir(traces / arm)
        for path in find_traces(trace_dir):  # the demo owns this folder; old parts would mix with new ones
            path.unlink()
        step(f"{arm}: a fresh sglang server on CPU" + (" with the four fixes installed live" if arm == FIXED else "")
             + f", re-driving {workload_path.name} ({plural(len(workload.requests), 'request')} over "
             f"{span:.0f}s, {aborted} dropped by the client, as recorded)")
        click.echo(f"    launch flags (the recording's): {' '.join(flags)}; tracing into {trace_dir}")
        try:
            with Activity() as activity:
                run = redrive_arm(arm, workload, flags, work, trace_dir=trace_dir,
                                  on_progress=activity.requests(f"re-driving ({arm})"))
        except (EndpointUnreachableError, SchedtraceError) as exc:
            click.echo(f"    {exc}")
            failures.append(f"the {arm} run failed")
            continue
        runs[arm] = run
        click.echo(f"    {run.line()}")
        if run.result.failed:
            failures.append(f"{run.result.failed} requests failed under {arm}")
        if not run.traces:
            failures.append(f"no trace written under {arm}")
    if FIXED in runs and not runs[FIXED].fixes_logged:
        failures.append("the fixed server did not log the fixes installed")

    reports: dict[str, tuple[Path, Report]] = {}
    for arm in (STOCK, FIXED):
        if arm not in runs or not runs[arm].traces:
            continue
        trace, report_path = runs[arm].traces[0], out_dir / f"{arm}-replay.json"
        step(f"schedtrace replay {trace} --json {report_path}")
        if run_subcommand(["replay", str(trace), "--json", str(report_path)]):
            reports[arm] = (trace, load_report(report_path))
        else:
            failures.append(f"replay of the {arm} run failed")

    browse = None
    if STOCK in reports:
        step("the live A/B")
        say(ab_findings(reports, {arm: len(run.facts.stalls) for arm, run in runs.items()}))
        trace, report = reports[STOCK]
        browse = (trace, out_dir / f"{STOCK}-replay.json")
        if report.fidelity.matched != report.fidelity.total:
            failures.append("the stock replay did not reproduce every recorded decision")
        if not report.divergences and not report.stalls.get(STOCK):
            step("the live stock run held no divergence and no stall this time (the stall needs the long "
                 "requests still running when the client's drop of the latched head lands)")
            browse = replay_sample(out_dir, failures) or browse
    finish(browse, failures, out_dir)


def ab_findings(reports: dict[str, tuple[Path, Report]], recorded_stalls: dict[str, int]) -> list[str]:
    """The live A/B in plain words: what the fixed logic would change on the stock run, and the fixed run.

    Both runs are replayed stock (the baseline, checked against the recording) against fixed."""
    trace, stock = reports[STOCK]
    stalls = stock.stalls.get(STOCK, [])
    lines = [f"stock run ({trace.name}): the fixed logic decides otherwise on "
             f"{plural(len(stock.divergences), 'pass')}"
             + (f", the first at pass {stock.divergences[0].pass_} ({', '.join(stock.divergences[0].kinds)}; "
                f"{', '.join(stock.divergences[0].fixes) or 'no single fix'})" if stock.divergences else "")
             + f"; {plural(len(stalls), 'stall')} under stock"
             + (f" ({', '.join(f'{s.start_pass}–{s.end_pass}' for s in stalls[:3])}): requests waited while "
                "sglang's own admission check would have let the head in" if stalls else "") + "."]
    if FIXED in reports:
        trace, fixed = reports[FIXED]
        acted = fixed.fidelity.total - fixed.fidelity.matched
        left = recorded_stalls.get(FIXED, 0) + len(fixed.stalls.get(FIXED, []))
        lines.append(f"fixed run ({trace.name}): the live server decided otherwise than the stock logic would on "
                     f"{plural(acted, 'pass')} of {fixed.fidelity.total} (the fixes at work); "
                     f"{plural(left, 'stall')}" + (" — the stall is gone live." if not left else "."))
    return lines
