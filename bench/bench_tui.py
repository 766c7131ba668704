"""TUI bench: first paint, next-divergence latency and memory on a 1,000,000-pass trace.

    python -m bench.bench_tui [--passes 1000000] [--runs 3] [--dir /tmp/schedtrace-bench]

Each figure is printed next to the same figure for a 1,000-pass trace
measured in the same run (machines here are noisy: read the ratios), as the
median of ``--runs`` fresh child processes (small and big interleaved, so
both see the same noise). Targets for the big trace: first paint <= 1.5 s,
jump <= 50 ms, RSS < 400 MB. Generated traces are kept in --dir and reused
(same seed, same bytes) while the trace contract's source is unchanged; its
digest is in their names, so a trace an older format wrote is never timed.

What is timed is the app, not the test harness: every frame the app hands
to its driver is timestamped (and serialised to terminal bytes, as a real
terminal would need), so

* ``first_paint_s``: process start of the measuring code (imports included)
  to the first frame that draws pass 0's detail (the list is drawn by then);
* ``jump_ms``: the ``n`` key event handed to the driver, to the last frame
  the app draws before it is idle again (list, timeline, detail and their
  scrollbars all updated; the app is ready for the next key). Taken once
  the background scan is over. Pilot's own settling waits are outside it;
* ``jump_first_ms``: the same key, to the first frame that draws the new
  pass's detail (the list cursor moves in that frame or before);
* ``jump_in_scan_ms``: ``jump_first_ms`` for keys pressed while the scan still
  runs (not a target; its progress draws frames of its own);
* ``rss_mb``: peak resident memory of the child (``ru_maxrss``), scan included;
* ``scan_s``: first paint to the background scan's end (not a target).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

SMALL = 1_000
JUMPS = 30
JUMPS_DURING_SCAN = 10
TARGETS = {"first_paint_s": 1.5, "jump_ms": 50.0, "rss_mb": 400.0}
FIGURES = ("first_paint_s", "jump_ms", "jump_first_ms", "jump_in_scan_ms", "rss_mb", "scan_s")


def contract_digest() -> str:
    """A digest of the trace contract's source: a kept trace written by other code is not reused."""
    import hashlib

    from schedtrace.tracer import contract

    digest = hashlib.sha1()
    for source in sorted(Path(contract.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:10]


def ensure_trace(directory: Path, passes: int) -> tuple[Path, Path]:
    from schedtrace.testing.synthetic import generate

    stem = f"bench-{passes}-{contract_digest()}"
    trace, report = directory / f"{stem}.trace", directory / f"{stem}.json"
    if not (trace.exists() and report.exists()):
        started = time.perf_counter()
        generate(trace, passes, seed=7, report_path=report)
        print(f"  generated {trace} ({trace.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.0f}s",
              flush=True)
    return trace, report


_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DETAIL_TITLE = re.compile(r"Pass (\d+)  t=")  # the detail pane's first line


class FrameClock:
    """Timestamps every frame the app displays (wraps ``App._display`` on the instance).

    Each frame is encoded to terminal bytes (headless drivers skip that; a real
    terminal pays for it) and the detail-pane titles drawn in it are noted, so
    "the screen shows pass N" is read off the frame itself, not the app's state.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.frames: list[tuple[float, tuple[int, ...]]] = []  # (time, passes whose detail title it drew)
        display = app._display

        def timed_display(screen, renderable) -> None:
            display(screen, renderable)
            render_segments = getattr(renderable, "render_segments", None)
            if render_segments is None:
                return
            terminal = render_segments(app.console)
            now = time.perf_counter()
            titles = tuple(int(n) for n in _DETAIL_TITLE.findall(_ESCAPE.sub("", terminal)))
            self.frames.append((now, titles))

        app._display = timed_display

    def last_since(self, t0: float) -> float | None:
        return self.frames[-1][0] if self.frames and self.frames[-1][0] >= t0 else None

    def first_showing(self, pass_no: int, t0: float) -> float | None:
        """When the first frame since ``t0`` drew pass ``pass_no``'s detail."""
        return next((t for t, titles in self.frames if t >= t0 and pass_no in titles), None)


async def _settle(pilot) -> None:
    """Wait until the app has handled everything and is idle (not timed)."""
    from textual._wait import wait_for_idle

    await pilot._wait_for_screen()
    await wait_for_idle(0.05)
    await pilot._wait_for_screen()


async def _measure(trace: str, report_path: str) -> dict[str, float]:
    import resource

    started = time.perf_counter()
    from schedtrace.tracer.contract.report import load_report
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tui.app import TraceApp

    app = TraceApp(TraceReader(trace), report=load_report(report_path))
    clock = FrameClock(app)
    async with app.run_test(size=(160, 48)) as pilot:
        while (shown := clock.first_showing(0, started)) is None:
            await pilot.pause(0.01)
        first_paint = shown - started
        during_scan = []
        while app.scan is None and len(during_scan) < JUMPS_DURING_SCAN:
            latency = await _jump(app, pilot, clock)
            if latency is None:
                break
            during_scan.append(latency[0])  # scan progress draws frames too: only the first counts
        while app.scan is None or any(worker.is_running for worker in app.workers):
            await pilot.pause(0.05)
        scan_s = time.perf_counter() - shown
        await _settle(pilot)
        jumps = []
        for _ in range(JUMPS):
            latency = await _jump(app, pilot, clock)
            if latency is None:
                break
            jumps.append(latency)
        assert jumps, "n never moved: no divergences?"
        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "first_paint_s": first_paint,
        "jump_ms": statistics.median(last for _, last in jumps) * 1000,
        "jump_first_ms": statistics.median(first for first, _ in jumps) * 1000,
        # a 1,000-pass scan may be over before the first key: then the figure repeats jump_first_ms
        "jump_in_scan_ms": statistics.median(during_scan or [first for first, _ in jumps]) * 1000,
        "scan_s": scan_s,
        "rss_mb": rss_kb / 1024,
    }


async def _jump(app, pilot, clock: FrameClock) -> tuple[float, float] | None:
    """Press ``n``; seconds from the key event to the first frame drawing the new pass's
    detail, and to the last frame before the app went idle (None: it did not move)."""
    from textual import events

    before = app.selected
    key = events.Key("n", "n")
    key.set_sender(app)
    t0 = time.perf_counter()
    app._driver.send_message(key)
    await _settle(pilot)
    if app.selected == before:
        return None
    for _ in range(100):  # a busy app may draw it after the settle: wait for it (not timed)
        shown = clock.first_showing(app.selected, t0)
        if shown is not None:
            break
        await pilot.pause(0.05)
    assert shown is not None, f"no frame drew pass {app.selected}, the pass jumped to"
    return shown - t0, (clock.last_since(t0) or shown) - t0


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
