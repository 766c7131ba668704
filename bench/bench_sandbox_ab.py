"""Sandbox throughput with tracing on vs off, in alternating runs.

Each run starts a fresh sandbox server under the KV-pressure arguments (with
``SCHEDTRACE_DIR`` set or not), drives it with sglang's bench_serving client,
and stops it. Runs alternate off, on, off, on, ... so drift on a shared
machine hits both sides alike. Prints every figure, the on/off ratio of the
means, each round's paired ratio, and the run-to-run spread.

    python -m bench.bench_sandbox_ab [--rounds 2] [--prompts 96]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from schedtrace.tracer.sandbox.load import LoadResult, LoadSpec, run_load
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer

# Smaller than the demo's load so a run takes about a minute on 2 cores.
BENCH_LOAD = LoadSpec(num_prompts=96, max_concurrency=24, input_len=3000, output_len=100)


@dataclass(frozen=True)
class Run:
    tracing: bool
    result: LoadResult
    trace_bytes: int

    @property
    def tokens_per_s(self) -> float:
        r = self.result
        return (r.total_input_tokens + r.total_output_tokens) / r.duration_s if r.duration_s else 0.0


def one_run(tracing: bool, spec: LoadSpec, work: Path) -> Run:
    trace_dir = work / "traces" if tracing else None
    with SandboxServer(trace_dir=trace_dir, extra_args=KV_PRESSURE_ARGS,
                       log_path=work / "server.log") as server:
        result = run_load(server.url, spec, work / "load")
    trace_bytes = sum(p.stat().st_size for p in trace_dir.rglob("*.trace")) if trace_dir else 0
    return Run(tracing, result, trace_bytes)


def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    rel = (max(values) - min(values)) / mean if mean else 0.0
    return f"mean {mean:.1f}, min {min(values):.1f}, max {max(values):.1f}, spread {rel:.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="off/on pairs (default 2)")
    parser.add_argument("--prompts", type=int, default=BENCH_LOAD.num_prompts)
    args = parser.parse_args(argv)
    spec = LoadSpec(**{**BENCH_LOAD.__dict__, "num_prompts": args.prompts})

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="schedtrace-bench-ab-") as tmp:
        for i in range(args.rounds * 2):
            tracing = i % 2 == 1
            run = one_run(tracing, spec, Path(tmp) / f"run{i}")
            runs.append(run)
            r = run.result
            print(f"run {i} tracing={'on ' if tracing else 'off'}: {run.tokens_per_s:8.1f} tok/s, "
                  f"{r.request_throughput:.3f} req/s, {r.completed}/{r.num_prompts} completed, "
                  f"{r.duration_s:.1f}s, trace {run.trace_bytes} B", flush=True)

    off = [r.tokens_per_s for r in runs if not r.tracing]
    on = [r.tokens_per_s for r in runs if r.tracing]
    print(f"tracing off: {spread(off)} tok/s")
    print(f"tracing on:  {spread(on)} tok/s")
    paired = [b / a for a, b in zip(off, on) if a]
    print("paired on/off ratios: " + ", ".join(f"{x:.3f}" for x in paired))
    print(f"on/off throughput ratio (means): {statistics.fmean(on) / statistics.fmean(off):.3f}")
    return 0 if all(r.result.failed == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
