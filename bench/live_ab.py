"""Live A/B of the scheduler fixes: stock vs ``SCHEDTRACE_FIXES=all`` on the real server.

Each run starts a fresh sandbox server under the demo's KV-pressure
arguments, with tracing on and, for the fixed arm, the four fixes installed
live through ``SCHEDTRACE_FIXES=all``; drives it with sglang's bench_serving
client; stops it; and reads back what the scheduler did from its traces:
completed requests, stalls (``schedtrace.tracer.analysis.stalls`` on the recorded decisions),
over-asks (failed ``alloc`` records) and exceptions such as the one-chunk
assert (``schedtrace.cli.info``). Runs alternate stock, fixed, stock, fixed, ... so
drift on a shared machine hits both arms alike; the bench prints every run
and the fixed/stock ratios.

    python -m bench.live_ab [--rounds 2] [--prompts 96]

tests/test_live_ab.py runs one small round of the same thing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Stall
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.cli.info import summarize
from schedtrace.tracer.sandbox.load import LoadResult, LoadSpec, run_load
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer
from schedtrace.tracer.contract.schema import Finish, Pass

ARMS: dict[str, str | None] = {"stock": None, "fixed": "all"}  # arm -> SCHEDTRACE_FIXES
FIXES_LOG_MARK = "SCHEDTRACE_FIXES=all"  # what install_fixes_from_env logs in each server process
# The demo's overload shape (schedtrace.tracer.sandbox.load.LoadSpec defaults), sized for the bench.
BENCH_LOAD = LoadSpec(num_prompts=96, max_concurrency=48, input_len=3000, output_len=300)


@dataclass
class TraceFacts:
    """What the scheduler did, read back from one arm's trace files."""

    files: int = 0
    pass_records: int = 0
    arrivals: int = 0
    finished: int = 0  # finish records (every request the scheduler completed)
    stalls: list[Stall] = field(default_factory=list)
    over_asks: int = 0  # alloc records that failed
    exceptions: list[str] = field(default_factory=list)  # pass errors and hook errors

    @property
    def asserts(self) -> int:
        return sum(1 for e in self.exceptions if e.startswith("AssertionError"))


@dataclass(frozen=True)
class ArmRun:
    arm: str
    result: LoadResult
    facts: TraceFacts
    fixes_logged: bool  # the server log shows the fixes installed

    @property
    def tokens_per_s(self) -> float:
        r = self.result
        return (r.total_input_tokens + r.total_output_tokens) / r.duration_s if r.duration_s else 0.0

    def line(self) -> str:
        f, r = self.facts, self.result
        return (
            f"{self.arm:5}: {r.completed}/{r.num_prompts} completed ({f.finished} finish records), "
            f"{len(f.stalls)} stalls ({sum(s.passes for s in f.stalls)} passes), {f.over_asks} over-asks, "
            f"{f.asserts} asserts, {len(f.exceptions)} exceptions; {self.tokens_per_s:.0f} tok/s, "
            f"TTFT mean {r.mean_ttft_ms:.0f} ms, {r.duration_s:.1f}s"
        )


def trace_facts(paths: list[Path], stall_passes: int = DEFAULT_STALL_PASSES) -> TraceFacts:
    facts = TraceFacts(files=len(paths))
    for path in paths:
        with TraceReader(path) as reader:
            summary = summarize(reader)
            anomalies = summary["anomalies"]
            facts.over_asks += anomalies["failed_allocs"]
            facts.exceptions += [e["message"] for e in anomalies["exception_list"]]
            facts.arrivals += summary["requests"]
            scanner = StallScanner(stall_passes, reader.header.server_args.max_running_requests)
            for _, record in reader.records():
                if isinstance(record, Pass):
                    facts.pass_records += 1
                    scanner.feed_pass(record, recorded_decision(record))
                elif isinstance(record, Finish):
                    facts.finished += 1
            facts.stalls += scanner.finish()
    return facts


def run_arm(arm: str, spec: LoadSpec, work: Path, stall_passes: int = DEFAULT_STALL_PASSES) -> ArmRun:
    """One fresh server for ``arm``, one load, traces read back."""
    trace_dir = work / "traces"
    log_path = work / "server.log"
    with SandboxServer(trace_dir=trace_dir, fixes=ARMS[arm], extra_args=KV_PRESSURE_ARGS, log_path=log_path) as server:
        result = run_load(server.url, spec, work / "load")
    traces = sorted(trace_dir.rglob("*.trace"))
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    return ArmRun(arm, result, trace_facts(traces, stall_passes), FIXES_LOG_MARK in log)


def _ratio(fixed: list[float], stock: list[float]) -> str:
    a, b = statistics.fmean(stock), statistics.fmean(fixed)
    return f"{b / a:.3f}" if a else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="stock/fixed pairs (default 2)")
    parser.add_argument("--prompts", type=int, default=BENCH_LOAD.num_prompts)
    args = parser.parse_args(argv)
    spec = LoadSpec(**{**BENCH_LOAD.__dict__, "num_prompts": args.prompts})

    runs: list[ArmRun] = []
    with tempfile.TemporaryDirectory(prefix="schedtrace-live-ab-") as tmp:
        for i in range(args.rounds * 2):
            arm = "stock" if i % 2 == 0 else "fixed"
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
        stock = [get(r) for r in by_arm["stock"]]
        fixed = [get(r) for r in by_arm["fixed"]]
        paired = ", ".join(f"{f / s:.3f}" if s else "n/a" for s, f in zip(stock, fixed))
        print(f"{metric}: stock {statistics.fmean(stock):.1f}, fixed {statistics.fmean(fixed):.1f}, "
              f"fixed/stock {_ratio(fixed, stock)} (paired: {paired})")
    for arm, arm_runs in by_arm.items():
        print(f"{arm}: stalls {[len(r.facts.stalls) for r in arm_runs]}, "
              f"over-asks {[r.facts.over_asks for r in arm_runs]}, asserts {[r.facts.asserts for r in arm_runs]}")
    ok = all(r.result.failed == 0 for r in runs) and all(r.fixes_logged for r in by_arm["fixed"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
