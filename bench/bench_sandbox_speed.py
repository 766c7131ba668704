"""Sandbox requests per second with the model forward stood in for, against the real forward.

Each run starts a fresh sandbox server (the same model, the same KV-pressure
arguments, no tracing), once with its real tiny forward and once with the
forward stand-in (``SandboxServer(stand_in_forward=True)``: deterministic
tokens, the scheduler, pools, sampling and request lifecycle real), drives
it with sglang's bench_serving client, and stops it. Runs alternate real,
stand-in, real, stand-in, ... so drift on a shared machine hits both alike.
The ratio says how much faster a long overload soak runs with the forward
stood in for.

    python -m bench.bench_sandbox_speed [--rounds 1] [--prompts 64] [--model llama]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from schedtrace.tracer.sandbox.load import LoadResult, LoadSpec, run_load
from schedtrace.tracer.sandbox.models import DEFAULT_MODEL, MODELS
from schedtrace.tracer.sandbox.server import SandboxServer

# Short prompts and outputs: the forward's share of the time is what differs.
BENCH_LOAD = LoadSpec(num_prompts=64, max_concurrency=16, input_len=800, output_len=64)


@dataclass(frozen=True)
class Run:
    stand_in: bool
    result: LoadResult


def one_run(model: str, stand_in: bool, spec: LoadSpec, work: Path) -> Run:
    server = SandboxServer(model=model, stand_in_forward=stand_in, overload=True, log_path=work / "server.log")
    with server:
        result = run_load(server.url, spec, work / "load", server.model_dir)
    return Run(stand_in, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="real/stand-in pairs (default 1)")
    parser.add_argument("--prompts", type=int, default=BENCH_LOAD.num_prompts)
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=[m for m, e in MODELS.items() if e.real_forward])
    args = parser.parse_args(argv)
    spec = LoadSpec(**{**BENCH_LOAD.__dict__, "num_prompts": args.prompts})

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="schedtrace-bench-speed-") as tmp:
        for i in range(args.rounds * 2):
            run = one_run(args.model, i % 2 == 1, spec, Path(tmp) / f"run{i}")
            runs.append(run)
            r = run.result
            print(f"run {i} {args.model} forward={'stand-in' if run.stand_in else 'real    '}: "
                  f"{r.request_throughput:.2f} req/s, {r.output_throughput:.0f} out tok/s, "
                  f"{r.completed}/{r.num_prompts} completed, {r.duration_s:.1f}s", flush=True)

    real = [r.result.request_throughput for r in runs if not r.stand_in]
    stand_in = [r.result.request_throughput for r in runs if r.stand_in]
    paired = ", ".join(f"{s / r:.2f}" for r, s in zip(real, stand_in) if r)
    print(f"real forward: {statistics.fmean(real):.2f} req/s; stand-in forward: {statistics.fmean(stand_in):.2f} req/s")
    print(f"stand-in/real requests per second: {statistics.fmean(stand_in) / statistics.fmean(real):.2f} "
          f"(paired: {paired})")
    return 0 if all(r.result.failed == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
