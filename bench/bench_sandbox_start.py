"""A sandbox server's start: sglang's spawned children against the sandbox's forked ones.

Each run starts a fresh llama sandbox (no tracing), waits until it is healthy,
reads the CPU its processes have used from /proc, and stops it. Runs alternate
spawn, fork, spawn, fork, ... (``SCHEDTRACE_SANDBOX_START_METHOD``) so drift on
a shared machine hits both alike. Printed: seconds to healthy and CPU seconds
at healthy per run, their medians, and fork's as a ratio of spawn's.

    python -m bench.bench_sandbox_start [--rounds 2] [--model llama]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from schedtrace.tracer.contract.names import START_METHOD_ENV
from schedtrace.tracer.sandbox.models import DEFAULT_MODEL, MODELS
from schedtrace.tracer.sandbox.process import group_members, proc_stat
from schedtrace.tracer.sandbox.server import SandboxServer
from schedtrace.tracer.sandbox.start_method import FORK, SPAWN

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Start:
    method: str
    healthy_s: float
    cpu_s: float  # every live process of the server's group, user + system


def process_cpu_s(pid: int) -> float:
    fields = proc_stat(pid)
    if fields is None:
        return 0.0  # gone between the listing and the read
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def one_start(model: str, method: str, work: Path) -> Start:
    server = SandboxServer(model=model, env={START_METHOD_ENV: method}, log_path=work / f"{method}.log")
    with server:
        assert server.pid is not None
        cpu = sum(process_cpu_s(pid) for pid in group_members(server.pid))
        return Start(method, server.start_seconds, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="spawn/fork pairs (default 2)")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    args = parser.parse_args(argv)
    starts: list[Start] = []
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        for _ in range(args.rounds):
            for method in (SPAWN, FORK):
                start = one_start(args.model, method, Path(tmp))
                starts.append(start)
                print(f"{method:5}  healthy in {start.healthy_s:5.1f} s  CPU {start.cpu_s:5.1f} s", flush=True)
    medians = {
        method: (statistics.median(s.healthy_s for s in starts if s.method == method),
                 statistics.median(s.cpu_s for s in starts if s.method == method))
        for method in (SPAWN, FORK)
    }
    for method, (healthy, cpu) in medians.items():
        print(f"median {method:5}  healthy in {healthy:5.1f} s  CPU {cpu:5.1f} s")
    (spawn_h, spawn_c), (fork_h, fork_c) = medians[SPAWN], medians[FORK]
    print(f"fork / spawn: {fork_h / spawn_h:.2f}x to healthy, {fork_c / spawn_c:.2f}x CPU ({args.model}, "
          f"{args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
