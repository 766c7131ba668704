"""Live A/B of the scheduler fixes: stock vs ``SCHEDTRACE_FIXES=all`` on the real server.

Each run is one ``schedtrace.tracer.sandbox.ab.run_arm``: a fresh sandbox
server under the demo's KV-pressure arguments, with tracing on and, for the
fixed arm, the four fixes installed live; sglang's bench_serving client
drives it; what the scheduler did (completed requests, stalls, over-asks,
exceptions such as the one-chunk assert) is read back from its traces.
Runs alternate stock, fixed, stock, fixed, ... so drift on a shared machine
hits both arms alike; the bench prints every run and the fixed/stock ratios.

    python -m bench.live_ab [--rounds 2] [--prompts 96]
    python -m bench.live_ab --workload traces/latch-abort-live.trace [--rounds 2] [--speedup 1]

``--workload TRACE`` re-drives a recorded workload in place of the synthetic
one (``schedtrace.tracer.sandbox.ab.redrive_arm``): each server gets the
recording's scheduling flags, and each run prints its requests' outcomes,
stalls, over-asks and asserts.

tests/test_live_ab.py runs one small round of the same thing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from schedtrace.tracer.analysis.workload import read_workload
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import FIXED, STOCK
from schedtrace.tracer.sandbox.ab import ARMS, ArmRun, RedriveArm, launch_args_for, redrive_arm, run_arm
from schedtrace.tracer.sandbox.load import LoadSpec

# The demo's overload shape (schedtrace.tracer.sandbox.load.LoadSpec defaults), sized for the bench.
BENCH_LOAD = LoadSpec(num_prompts=96, max_concurrency=48, input_len=3000, output_len=300)


def _ratio(fixed: list[float], stock: list[float]) -> str:
    a, b = statistics.fmean(stock), statistics.fmean(fixed)
    return f"{b / a:.3f}" if a else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="stock/fixed pairs (default 2)")
    parser.add_argument("--prompts", type=int, default=BENCH_LOAD.num_prompts)
    parser.add_argument("--workload", type=Path, help="re-drive this recorded trace's workload instead")
    parser.add_argument("--speedup", type=float, default=1.0, help="with --workload: send this much faster")
    args = parser.parse_args(argv)
    if args.workload is not None:
        return workload_rounds(args.workload, args.rounds, args.speedup)
    spec = LoadSpec(**{**BENCH_LOAD.__dict__, "num_prompts": args.prompts})

    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="schedtrace-live-ab-") as tmp:
        for i in range(args.rounds * 2):
            arm = STOCK if i % 2 == 0 else FIXED
            run = run_arm(arm, spec, Path(tmp) / f"run{i}-{arm}")
            runs.append(run)
            print(f"run {i} {run.line()}", flush=True)

    by_arm = {arm: [r for r in runs if r.arm == arm] for arm in ARMS}
    for metric, get in (
        ("throughput (tok/s)", lambda r: r.tokens_per_s),
        ("mean TTFT (ms)", lambda r: r.result.mean_ttft_ms),
        ("p99 TTFT (ms)", lambda r: r.result.p99_ttft_ms),
        ("completed", lambda r: float(r.result.completed)),
    ):
        stock = [get(r) for r in by_arm[STOCK]]
        fixed = [get(r) for r in by_arm[FIXED]]
        paired = ", ".join(f"{f / s:.3f}" if s else "n/a" for s, f in zip(stock, fixed))
        print(f"{metric}: stock {statistics.fmean(stock):.1f}, fixed {statistics.fmean(fixed):.1f}, "
              f"fixed/stock {_ratio(fixed, stock)} (paired: {paired})")
    for arm, arm_runs in by_arm.items():
        print(f"{arm}: stalls {[len(r.facts.stalls) for r in arm_runs]}, "
              f"over-asks {[r.facts.over_asks for r in arm_runs]}, asserts {[r.facts.asserts for r in arm_runs]}")
    ok = all(r.result.failed == 0 for r in runs) and all(r.fixes_logged for r in by_arm[FIXED])
    return 0 if ok else 1


def workload_rounds(trace: Path, rounds: int, speedup: float) -> int:
    """Alternate stock and fixed servers re-driving the recorded workload of ``trace``."""
    with TraceReader(trace) as reader:
        workload = read_workload([reader])
        flags = launch_args_for(reader.header.server_args)
    print(f"{trace.name}: {len(workload.requests)} requests; launch flags {' '.join(flags)}", flush=True)
    runs: list[RedriveArm] = []
    with tempfile.TemporaryDirectory(prefix="schedtrace-live-ab-") as tmp:
        for i in range(rounds * 2):
            arm = STOCK if i % 2 == 0 else FIXED
            run = redrive_arm(arm, workload, flags, Path(tmp) / f"run{i}-{arm}", speedup=speedup)
            runs.append(run)
            print(f"run {i} {run.line()}", flush=True)
    for arm in ARMS:
        arm_runs = [r for r in runs if r.arm == arm]
        print(f"{arm}: stalls {[len(r.facts.stalls) for r in arm_runs]}, stalled passes "
              f"{[sum(s.passes for s in r.facts.stalls) for r in arm_runs]}, over-asks "
              f"{[r.facts.over_asks for r in arm_runs]}, asserts {[r.facts.asserts for r in arm_runs]}, "
              f"seconds {[round(r.duration_s, 1) for r in arm_runs]}")
    ok = all(r.result.failed == 0 for r in runs) and all(r.fixes_logged for r in runs if r.arm == FIXED)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
