"""`make bench`: run every benchmark in turn (each prints figures and ratios).

Benchmarks are not tests: nothing here asserts a time. Each one measures its
own baseline in the same run because these machines are noisy.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

BENCHES = (
    "bench.bench_recorder",
    "bench.bench_hybrid",
    "bench.bench_otel",
    "bench.bench_replay",
    "bench.bench_tui",
    "bench.bench_sandbox_ab",
    "bench.bench_sandbox_speed",
    "bench.bench_sandbox_start",
    "bench.bench_format",
    "bench.bench_ranks",
    "bench.bench_repro",
    "bench.bench_size",
    "bench.bench_ring",
    "bench.bench_ray",
    "bench.bench_hostile",
    "bench.bench_prefix_ids",
)


def main(names: list[str]) -> int:
    failed = []
    for name in names or BENCHES:
        if importlib.util.find_spec(name) is None:
            print(f"== {name}: not present, skipped")
            continue
        print(f"== {name}", flush=True)
        if subprocess.call([sys.executable, "-m", name]) != 0:
            failed.append(name)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
