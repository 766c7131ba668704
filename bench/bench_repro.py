"""``schedtrace repro`` cost: shrink and emit a sample-trace divergence against one replay of its pass.

On traces/kv-pressure-lpm-24k.trace pass 867 (the sample's one divergence,
latch; 24 waiting, 8 running):

* baseline: one replay of that pass, ``PassDriver.decide`` under stock and
  under the fix, which is what replay itself does for the pass;
* repro: find the divergence, shrink it with the real code and emit the
  module (``schedtrace.replay.repro.pipeline.build``), without the pytest
  verification (its cost is the pytest processes' sglang import, not ours);
* verification: the emitted module run on stock and under each fix, two
  pytest processes at a time, forked from one process that imported sglang
  once (``schedtrace.replay.repro.forkserver``), against the same runs as
  plain ``python -m pytest`` processes, once each (``--no-verify`` skips it);

printed as seconds, as a ratio over the baseline, and as the count of
real-code calls (``PassDriver.decide``) the shrink made. Both are run
``--runs`` times after a warm-up; the medians are printed. Nothing here
asserts a time.

Run: ``python -m bench.bench_repro [--runs N] [--no-verify]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", category=UserWarning)
from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV  # the contract imports no sglang
os.environ.setdefault(SGLANG_CPU_ENGINE_ENV, "1")

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace"
PASS = 867
FIX = "latch"


def _median_seconds(work, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 5
    from schedtrace.replay.driver import PassDriver
    from schedtrace.replay.repro.pipeline import build
    from schedtrace.tracer.analysis.decision import replay_inputs
    from schedtrace.tracer.contract.format import TraceReader

    with TraceReader(SAMPLE) as reader:
        header = reader.header
        p = replay_inputs(reader.pass_at(PASS))
    driver = PassDriver(header)

    def replay_once() -> None:
        driver.decide(p, "stock")
        driver.decide(p, FIX)

    replay_once()  # warm: fixes compiled, sglang imported
    build(SAMPLE, PASS)
    baseline = _median_seconds(replay_once, runs)
    shrink = _median_seconds(lambda: build(SAMPLE, PASS), runs)
    repro = build(SAMPLE, PASS)
    case = repro.cases[0]
    print(f"{SAMPLE.name} pass {PASS}: {', '.join(case.divergent.kinds)}, fixed by {case.divergent.fixes}")
    print(f"  shrunk: {case.shrunk}")
    print(f"replay of the pass (stock + {FIX}):   {baseline * 1e3:9.2f} ms")
    print(f"find + shrink + emit:              {shrink * 1e3:9.2f} ms  ({shrink / baseline:.0f}x the replay)")
    print(f"real-code calls (PassDriver.decide): {repro.calls} (the replay of the pass: 2)")
    print(f"emitted module: {len(repro.text.splitlines())} lines")
    if "--no-verify" not in argv:
        _verification(repro)
    return 0


def _verification(repro) -> None:
    import tempfile

    from schedtrace.arms.fixes import FIX_NAMES
    from schedtrace.replay.repro.verify import run_variants
    from schedtrace.tracer.contract.names import STOCK

    variants = [STOCK, *FIX_NAMES]
    with tempfile.TemporaryDirectory() as tmp:
        module = Path(tmp) / "test_sample_pass867.py"
        module.write_text(repro.text)
        seconds = {}
        for fork in (False, True):
            start = time.perf_counter()
            runs = run_variants([module], variants, fork=fork)
            seconds[fork] = time.perf_counter() - start
            outcomes = " ".join(f"{run.variant}:{run.outcome}" for run in runs)
            print(f"verify, {'forked' if fork else 'plain'} processes: {seconds[fork]:7.1f} s  ({outcomes})")
    print(f"forked / plain: {seconds[True] / seconds[False]:.2f}x ({len(variants)} variants, 2 at a time)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
