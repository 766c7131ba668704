"""TUI bench: first paint, next-divergence latency and memory on a 1,000,000-pass trace.

    python -m bench.bench_tui [--passes 1000000] [--runs 3] [--dir /tmp/schedtrace-bench]

Each figure is printed next to the same figure for a 1,000-pass trace
measured in the same run (machines here are noisy: read the ratios), as the
median of ``--runs`` fresh child processes (small and big interleaved, so
both see the same noise). Targets for the big trace: first paint <= 1.5 s,
jump <= 50 ms, RSS < 400 MB. Generated traces are kept in --dir and reused
(same seed, same bytes).

What is timed is the app, not the test harness: every frame the app hands
to its driver is timestamped (and serialised to terminal bytes, as a real
terminal would need), so

* ``first_paint_s``: process start of the measuring code (imports included)
  to the first frame that shows the pass list and the selected pass's detail;
* ``jump_ms``: the ``n`` key event handed to the driver, to the last frame
  drawn before the app goes idle again (list, timeline and detail updated).
  Pilot's own settling waits are outside that window;
* ``rss_mb``: peak resident memory of the child (``ru_maxrss``), scan included;
* ``scan_s``: first paint to the background scan's end (not a target).
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
FIGURES = ("first_paint_s", "jump_ms", "rss_mb", "scan_s")


def ensure_trace(directory: Path, passes: int) -> tuple[Path, Path]:
    from bench.gen_trace import generate

    trace, report = directory / f"bench-{passes}.trace", directory / f"bench-{passes}.json"
    if not (trace.exists() and report.exists()):
        started = time.perf_counter()
        generate(trace, passes, seed=7, report_path=report)
        print(f"  generated {trace} ({trace.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f}s",
              flush=True)
    return trace, report


class FrameClock:
    """Timestamps every frame the app displays (wraps ``App._display`` on the instance)."""

    def __init__(self, app) -> None:
        self.app = app
        self.frames: list[float] = []
        self.first_full: float | None = None  # first frame with passes and a pass's detail
        display = app._display

        def timed_display(screen, renderable) -> None:
            display(screen, renderable)
            if renderable is None:
                return
            # Headless drivers skip the terminal encoding; do it, a real terminal pays for it.
            render_segments = getattr(renderable, "render_segments", None)
            if render_segments is not None:
                render_segments(app.console)
            now = time.perf_counter()
            self.frames.append(now)
            if self.first_full is None and self._shows_a_pass():
                self.first_full = now

        app._display = timed_display

    def _shows_a_pass(self) -> bool:
        from textual.css.query import NoMatches

        from tui.widgets.detail import DetailPane

        try:
            pane = self.app.query_one(DetailPane)
        except NoMatches:
            return False
        return self.app.passes > 0 and "No pass selected" not in str(pane.renderable)

    def last_since(self, t0: float) -> float | None:
        later = [t for t in self.frames if t >= t0]
        return later[-1] if later else None


async def _settle(pilot) -> None:
    """Wait until the app has handled everything and is idle (not timed)."""
    from textual._wait import wait_for_idle

    await pilot._wait_for_screen()
    await wait_for_idle(0.05)
    await pilot._wait_for_screen()


async def _measure(trace: str, report_path: str) -> dict[str, float]:
    import resource

    started = time.perf_counter()
    from textual import events

    from replay.report import load_report
    from tracer.format import TraceReader
    from tui.app import TraceApp

    app = TraceApp(TraceReader(trace), report=load_report(report_path))
    clock = FrameClock(app)
    async with app.run_test(size=(160, 48)) as pilot:
        while clock.first_full is None:
            await pilot.pause(0.01)
        first_paint = clock.first_full - started
        while any(worker.is_running for worker in app.workers):
            await pilot.pause(0.05)
        scan_s = time.perf_counter() - clock.first_full
        await _settle(pilot)
        jumps = []
        for _ in range(JUMPS):
            before = app.selected
            key = events.Key("n", "n")
            key.set_sender(app)
            t0 = time.perf_counter()
            app._driver.send_message(key)
            await _settle(pilot)
            if app.selected == before:
                break
            last_frame = clock.last_since(t0)
            assert last_frame is not None, "the jump drew no frame"
            jumps.append(last_frame - t0)
        assert jumps, "n never moved: no divergences?"
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


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in FIGURES}


@click.command()
@click.option("--passes", type=int, default=1_000_000, show_default=True)
@click.option("--runs", type=int, default=3, show_default=True, help="Child processes per trace; medians shown.")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default="/tmp/schedtrace-bench",
              show_default=True)
@click.option("--child", nargs=2, type=str, default=None, hidden=True)
def main(passes: int, runs: int, directory: str, child: tuple[str, str] | None) -> None:
    if child:
        import asyncio

        print(json.dumps(asyncio.run(_measure(*child))))
        return
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    small_trace, big_trace = ensure_trace(where, SMALL), ensure_trace(where, passes)
    small_runs, big_runs = [], []
    for i in range(max(runs, 1)):
        small_runs.append(measure_in_child(*small_trace))
        big_runs.append(measure_in_child(*big_trace))
        run = big_runs[-1]
        print(f"  run {i + 1}: big " + "  ".join(f"{key} {run[key]:.3f}" for key in FIGURES), flush=True)
    small, big = medians(small_runs), medians(big_runs)
    print(f"medians of {len(big_runs)} runs")
    print(f"{'figure':<16}{f'{SMALL:,} passes':>16}{f'{passes:,} passes':>18}{'ratio':>8}{'target':>10}")
    for key in FIGURES:
        target = TARGETS.get(key)
        verdict = "" if target is None else (" ok" if big[key] <= target else " MISSED")
        ratio = f"{big[key] / small[key]:.2f}" if small[key] >= 1e-3 else "-"
        target_text = "" if target is None else f"<= {target:g}"
        print(f"{key:<16}{small[key]:>16.3f}{big[key]:>18.3f}{ratio:>8}{target_text:>10}{verdict}")


if __name__ == "__main__":
    main()
