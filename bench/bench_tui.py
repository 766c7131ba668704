"""TUI bench: first paint, next-divergence latency and memory on a 1,000,000-pass trace.

    python -m bench.bench_tui [--passes 1000000] [--dir /tmp/schedtrace-bench]

Each figure is printed next to the same figure for a 1,000-pass trace
measured in the same run (machines here are noisy: read the ratios).
Targets for the big trace: first paint <= 1.5 s, jump <= 50 ms, RSS < 400 MB.
Each measurement runs in a fresh child process so RSS is its own.
Generated traces are kept in --dir and reused (same seed, same bytes).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

SMALL = 1_000
JUMPS = 30
TARGETS = {"first_paint_s": 1.5, "jump_ms": 50.0, "rss_mb": 400.0}


def ensure_trace(directory: Path, passes: int) -> tuple[Path, Path]:
    from bench.gen_trace import generate

    trace, report = directory / f"bench-{passes}.trace", directory / f"bench-{passes}.json"
    if not (trace.exists() and report.exists()):
        started = time.perf_counter()
        generate(trace, passes, seed=7, report_path=report)
        print(f"  generated {trace} ({trace.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f}s",
              flush=True)
    return trace, report


async def _measure(trace: str, report_path: str) -> dict[str, float]:
    import resource

    started = time.perf_counter()
    from replay.report import load_report
    from tracer.format import TraceReader
    from tui.app import TraceApp

    app = TraceApp(TraceReader(trace), report=load_report(report_path))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        first_paint = time.perf_counter() - started
        scan_started = time.perf_counter()
        while any(worker.is_running for worker in app.workers):
            await pilot.pause(0.05)
        scan_s = time.perf_counter() - scan_started
        await pilot.pause()
        jumps = []
        for _ in range(JUMPS):
            before = app.selected
            t0 = time.perf_counter()
            await pilot.press("n")  # returns after the key is processed and the screen refreshed
            jumps.append(time.perf_counter() - t0)
            if app.selected == before:
                break
        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "first_paint_s": first_paint,
        "jump_ms": statistics.median(jumps) * 1000,
        "scan_s": scan_s,
        "rss_mb": rss_kb / 1024,
    }


def measure_in_child(trace: Path, report: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.bench_tui", "--child", str(trace), str(report)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--passes", type=int, default=1_000_000, show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False), default="/tmp/schedtrace-bench",
              show_default=True)
@click.option("--child", nargs=2, type=str, default=None, hidden=True)
def main(passes: int, directory: str, child: tuple[str, str] | None) -> None:
    if child:
        import asyncio

        print(json.dumps(asyncio.run(_measure(*child))))
        return
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    small = measure_in_child(*ensure_trace(where, SMALL))
    big = measure_in_child(*ensure_trace(where, passes))
    print(f"{'figure':<16}{f'{SMALL:,} passes':>16}{f'{passes:,} passes':>18}{'ratio':>8}{'target':>10}")
    for key in ("first_paint_s", "jump_ms", "rss_mb", "scan_s"):
        target = TARGETS.get(key)
        verdict = "" if target is None else (" ok" if big[key] <= target else " MISSED")
        ratio = big[key] / small[key] if small[key] else float("nan")
        target_text = "" if target is None else f"<= {target:g}"
        print(f"{key:<16}{small[key]:>16.3f}{big[key]:>18.3f}{ratio:>8.2f}{target_text:>10}{verdict}")


if __name__ == "__main__":
    main()
