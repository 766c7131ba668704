"""``--ray`` against the local run, same run: speedup, per-task overhead, and a cluster projection.

Three figures, each against a baseline measured here:

* speedup: ``replay_trace`` of one sample trace recorded by the sandbox
  (``traces/kv-pressure-lpm-24k.trace``, 1474 passes; ``--synthetic N``: a synthetic trace of N
  passes, ``tracer.contract.synthetic``, whose passes are much cheaper) in one process
  (``--jobs 1``), then its pass ranges as Ray tasks on a Ray started here with 1 and with 2 CPUs
  (two ranges either way: with one CPU they queue on one worker). Each Ray is warmed first (its
  workers import sglang once), so the timed run is the steady state a long job sees;
* per-task overhead: a near-empty task (``abs``) mapped 200 times on Ray and on the local
  two-process pool (``LocalExecutor(2)``), in ms per task and as a ratio;
* projection: 100 traces of 80,000 passes on 64 cores, from the per-pass cost measured on Ray
  here, the per-task overhead, and one worker start (the warm-up). A projection, not a
  measurement: it assumes cores as fast as these and storage every node can read.

Run: ``python -m bench.bench_ray [--synthetic N]``. Nothing here asserts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", category=UserWarning)
from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV  # the contract imports no sglang
os.environ.setdefault(SGLANG_CPU_ENGINE_ENV, "1")

SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces",
                      "kv-pressure-lpm-24k.trace")
FLEET_TRACES, FLEET_PASSES, FLEET_CORES = 100, 80_000, 64
OVERHEAD_TASKS = 200


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _ray_run(path: str, cpus: int, min_passes: int):
    """(warm-up seconds, timed seconds, per-task overhead seconds) on a Ray of ``cpus`` CPUs."""
    from schedtrace.replay.engine import replay_trace
    from schedtrace.replay.scale.ray_executor import RayExecutor

    with RayExecutor(jobs=cpus) as executor:
        executor.workers = 2  # two ranges whatever the CPUs: with one CPU they queue on one worker
        run = lambda: replay_trace(path, executor=executor, min_passes_per_job=min_passes)  # noqa: E731
        _, warm = _timed(run)
        report, seconds = _timed(run)
        list(executor.map(abs, range(-8, 0)))  # the task path warm too
        _, overhead = _timed(lambda: list(executor.map(abs, range(OVERHEAD_TASKS))))
    return report, warm, seconds, overhead / OVERHEAD_TASKS


def main(argv: list[str]) -> int:
    synthetic = int(argv[argv.index("--synthetic") + 1]) if "--synthetic" in argv else None
    from schedtrace.replay.engine import replay_trace
    from schedtrace.replay.scale.executor import LocalExecutor
    from schedtrace.tracer.contract.report import dump_report
    from schedtrace.testing.synthetic import generate

    with tempfile.TemporaryDirectory() as folder:
        path = SAMPLE
        if synthetic is not None:
            path = os.path.join(folder, "bench.trace")
            generate(path, synthetic, seed=7)
        print(f"trace: {path}")
        replay_trace(path)  # sglang imported and warm in this process too
        local, base = _timed(lambda: replay_trace(path))
        print(f"local --jobs 1: {local.passes} passes in {base:.2f} s = {local.passes / base:.0f} passes/s (baseline)")
        min_passes = local.passes // 2
        results = {}
        for cpus in (1, 2):
            report, warm, seconds, overhead = _ray_run(path, cpus, min_passes)
            same = dump_report(report) == dump_report(local)
            results[cpus] = (warm, seconds, overhead)
            print(f"ray, {cpus} worker{'s' if cpus > 1 else ''}: {seconds:.2f} s = {base / seconds:.2f}x the baseline "
                  f"(warm-up run {warm:.1f} s); report identical: {same}")
        pool = LocalExecutor(2)
        list(pool.map(abs, range(-8, 0)))
        _, pool_s = _timed(lambda: list(pool.map(abs, range(OVERHEAD_TASKS))))
        pool_task = pool_s / OVERHEAD_TASKS
        ray_task = results[2][2]
        print(f"per-task overhead: ray {ray_task * 1e3:.2f} ms, local pool {pool_task * 1e3:.2f} ms "
              f"= {ray_task / pool_task:.1f}x")

    per_pass = results[2][1] * 2 / local.passes  # core-seconds per pass on a Ray worker
    ranges = min(FLEET_CORES, FLEET_PASSES // min(2000, FLEET_PASSES))  # replay_trace's split, 2000 a range
    tasks = FLEET_TRACES * ranges
    worker_start = results[2][0] - results[2][1]  # the warm-up's extra: a worker importing sglang
    work = FLEET_TRACES * FLEET_PASSES * per_pass + tasks * ray_task
    cluster = work / FLEET_CORES + worker_start
    one_process = FLEET_TRACES * FLEET_PASSES * base / local.passes
    print(f"projection: {FLEET_TRACES} traces x {FLEET_PASSES} passes on {FLEET_CORES} cores = {tasks} tasks, "
          f"{cluster / 60:.1f} min (one process here: {one_process / 3600:.1f} h, {one_process / cluster:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
