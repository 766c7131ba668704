"""A live A/B arm: one fresh sandbox server, one bounded load, its traces read back.

``run_arm("stock" | "fixed", spec, work)`` starts a sandbox server under the
KV-pressure arguments with tracing on (and, for the fixed arm, the four
fixes installed live through ``SCHEDTRACE_FIXES=all``), drives it with
sglang's bench_serving client, stops it, and reads back what the scheduler
did: completed requests, stalls, over-asks (failed ``alloc`` records) and
exceptions such as the one-chunk assert, all through
``schedtrace.tracer.analysis.summary``. tests/test_live_ab.py runs one small
round; ``bench/live_ab.py`` alternates several and prints ratios.

``redrive_arm`` is the same with a recorded workload in place of
bench_serving: the server gets the recording's scheduling flags
(``launch_args_for``) and the workload is re-driven
(``schedtrace.tracer.sandbox.redrive``); ``schedtrace demo`` shows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from schedtrace.tracer.analysis.workload import Workload
from schedtrace.tracer.contract.schema import ServerArgs
from schedtrace.tracer.sandbox.redrive import ProgressCallback, RedriveResult, plan, redrive, server_vocab

from schedtrace.tracer.analysis.summary import summarize
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, FIXED, FIXES_ENV, STOCK
from schedtrace.tracer.contract.report import Stall
from schedtrace.tracer.sandbox.load import LoadResult, LoadSpec, run_load
from schedtrace.tracer.sandbox.server import KV_PRESSURE_ARGS, SandboxServer

ARMS: dict[str, str | None] = {STOCK: None, FIXED: "all"}  # arm -> SCHEDTRACE_FIXES
FIXES_LOG_MARK = f"{FIXES_ENV}=all"  # what install_fixes_from_env logs in each server process


@dataclass
class TraceFacts:
    """What the scheduler did, read back from one arm's trace files."""

    files: int = 0
    pass_records: int = 0
    arrivals: int = 0
    finished: int = 0  # finish records (every request the scheduler completed)
    stalls: list[Stall] = field(default_factory=list)
    over_asks: int = 0  # alloc records that failed
    exceptions: list[str] = field(default_factory=list)  # pass errors and hook errors (the first of each file)

    @property
    def asserts(self) -> int:
        return sum(1 for e in self.exceptions if e.startswith("AssertionError"))

    def describe(self) -> str:
        return (f"{self.finished} finish records, {len(self.stalls)} stalls "
                f"({sum(s.passes for s in self.stalls)} passes), {self.over_asks} over-asks, {self.asserts} asserts, "
                f"{len(self.exceptions)} exceptions")


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
            f"{self.arm:5}: {r.completed}/{r.num_prompts} completed; {f.describe()}; {self.tokens_per_s:.0f} tok/s, "
            f"TTFT mean {r.mean_ttft_ms:.0f} ms, {r.duration_s:.1f}s"
        )


def trace_facts(paths: list[Path], stall_passes: int = DEFAULT_STALL_PASSES) -> TraceFacts:
    facts = TraceFacts(files=len(paths))
    for path in paths:
        with TraceReader(path) as reader:
            summary = summarize(reader, stall_passes)
        anomalies = summary["anomalies"]
        facts.pass_records += summary["pass_records"]
        facts.arrivals += summary["requests"]
        facts.finished += summary["events"].get("finish", 0)
        facts.over_asks += anomalies["failed_allocs"]
        facts.exceptions += [e["message"] for e in anomalies["exception_list"]]
        facts.stalls += [
            Stall(start_pass=s["first_pass"], end_pass=s["first_pass"] + s["passes"] - 1,
                  passes=s["passes"], head_rid=s["head_rid"])
            for s in anomalies["stalls_while_kv_free"]
        ]
    return facts


def run_arm(arm: str, spec: LoadSpec, work: Path, stall_passes: int = DEFAULT_STALL_PASSES) -> ArmRun:
    """One fresh server for ``arm``, one load, traces read back."""
    with SandboxServer(trace_dir=work / "traces", fixes=ARMS[arm], extra_args=KV_PRESSURE_ARGS,
                       log_path=work / "server.log") as server:
        result = run_load(server.url, spec, work / "load", server.model_dir)
    _, facts, logged = read_back(work / "traces", work / "server.log", stall_passes)
    return ArmRun(arm, result, facts, logged)


def read_back(trace_dir: Path, log_path: Path, stall_passes: int) -> tuple[list[Path], TraceFacts, bool]:
    """An arm's traces, what they say, and whether its server log shows the fixes installed."""
    traces = sorted(trace_dir.rglob("*.trace"))
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    return traces, trace_facts(traces, stall_passes), FIXES_LOG_MARK in log


def launch_args_for(args: ServerArgs) -> tuple[str, ...]:
    """``sglang.launch_server`` flags that give a sandbox the recorded server's scheduling settings."""
    out = ["--schedule-policy", args.schedule_policy, "--max-prefill-tokens", str(args.max_prefill_tokens),
           "--page-size", str(args.page_size), "--schedule-conservativeness", str(args.schedule_conservativeness)]
    for flag, value in (("--chunked-prefill-size", args.chunked_prefill_size),
                        ("--max-running-requests", args.max_running_requests),
                        ("--max-total-tokens", args.max_total_tokens)):
        if value is not None:
            out += [flag, str(value)]
    for flag, on in (("--enable-mixed-chunk", args.enable_mixed_chunk),
                     ("--enable-priority-scheduling", args.enable_priority_scheduling),
                     ("--disable-radix-cache", args.disable_radix_cache)):
        if on:
            out.append(flag)
    return tuple(out)


@dataclass(frozen=True)
class RedriveArm:
    arm: str
    result: RedriveResult
    traces: list[Path]
    facts: TraceFacts
    fixes_logged: bool
    duration_s: float

    def line(self) -> str:
        return f"{self.arm:5}: {self.result.summary()}; {self.facts.describe()}; {self.duration_s:.1f}s"


def redrive_arm(arm: str, workload: Workload, launch_args: tuple[str, ...], work: Path, *,
                trace_dir: Path | None = None, speedup: float = 1.0, stall_passes: int = DEFAULT_STALL_PASSES,
                on_progress: ProgressCallback | None = None) -> RedriveArm:
    """One fresh server for ``arm`` with ``launch_args``, the workload re-driven, traces read back.

    Its log goes to ``work``, its traces to ``trace_dir`` (default ``work/traces``)."""
    trace_dir = trace_dir or work / "traces"
    server = SandboxServer(trace_dir=trace_dir, fixes=ARMS[arm], extra_args=launch_args,
                           log_path=work / "server.log")
    with server:
        started = time.monotonic()
        result = redrive(server.url, plan(workload, speedup=speedup, rid_prefix=f"{arm}-"), workload.block,
                         server_vocab(server.url), on_progress)
        duration = time.monotonic() - started
    traces, facts, logged = read_back(trace_dir, work / "server.log", stall_passes)
    return RedriveArm(arm, result, traces, facts, logged, duration)
