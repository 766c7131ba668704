"""Open-loop replay throughput against the bare sglang pass, same run.

Three figures on one synthetic trace (``bench.gen_trace``, realistic queue
and KV shapes):

* bare: ``Scheduler._get_new_batch_prefill_raw`` alone on state that is
  already built (the driver's stand-ins loaded, requests constructed), i.e.
  the cost of sglang's own decision; the floor no replay can beat;
* per arm: ``PassDriver.decide(pass, arm)`` for ``stock`` and ``fixed``,
  which also builds the requests and batch from the record; printed as
  passes/s and as a ratio over bare (target: <= 2x);
* whole trace: ``replay_trace`` end to end (two arms, fidelity, fix tagging
  of divergent passes, stalls), passes/s with 1 and 2 jobs.

Run: ``python -m bench.bench_replay [--passes N]``. Nothing here asserts.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", category=UserWarning)
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def _bare_seconds(driver, passes) -> float:
    """sglang's pass on pre-built state, nothing else in the timed region."""
    from schedtrace.replay.driver import _AdmissionDone, _stop_init_new

    sched = driver.scheduler
    ScheduleBatch = driver._ScheduleBatch
    original = ScheduleBatch.__dict__["init_new"]
    total = 0.0
    with driver._config.installed():
        ScheduleBatch.init_new = classmethod(_stop_init_new)
        try:
            for p in passes:
                waiting, batch, chunked = driver._load(p)
                sched.waiting_queue, sched.chunked_req = waiting, chunked
                sched.chunked_prefill_size = p.chunked_prefill_size
                sched.new_token_ratio_tracker.current = p.new_token_ratio
                start = time.perf_counter()
                try:
                    sched._get_new_batch_prefill_raw(None, batch)
                except _AdmissionDone:
                    pass
                except Exception:
                    pass
                total += time.perf_counter() - start
        finally:
            ScheduleBatch.init_new = original
    return total


def main(argv: list[str]) -> int:
    passes_wanted = int(argv[argv.index("--passes") + 1]) if "--passes" in argv else 6000
    from schedtrace.tracer.contract.synthetic import generate
    from schedtrace.replay.driver import PassDriver, _Ratio
    from schedtrace.replay.engine import replay_trace
    from schedtrace.tracer.contract.format import TraceReader

    work = tempfile.mkdtemp(prefix="schedtrace-bench-replay-")
    path = os.path.join(work, "bench.trace")
    generate(path, passes_wanted, seed=7)
    with TraceReader(path) as reader:
        header = reader.header
        passes = list(reader.passes())
    sample = passes[: min(len(passes), 3000)]
    driver = PassDriver(header)
    driver.decide(sample[0], "stock")  # warm: patches compiled, imports done
    driver.decide(sample[0], "fixed")
    driver.scheduler.new_token_ratio_tracker = _Ratio(0.0)

    bare = _bare_seconds(driver, sample)
    print(f"trace: {len(passes)} pass records; timing {len(sample)} of them")
    print(f"bare sglang pass (pre-built state): {len(sample) / bare:10.0f} passes/s  ({bare / len(sample) * 1e6:.1f} us/pass)")
    for arm in ("stock", "fixed"):
        start = time.perf_counter()
        for p in sample:
            driver.decide(p, arm)
        elapsed = time.perf_counter() - start
        print(f"PassDriver.decide[{arm:5}]:           {len(sample) / elapsed:10.0f} passes/s  "
              f"({elapsed / len(sample) * 1e6:.1f} us/pass, {elapsed / bare:.2f}x bare)")
    for jobs in (1, 2):
        start = time.perf_counter()
        report = replay_trace(path, "stock", "fixed", jobs=jobs)
        elapsed = time.perf_counter() - start
        print(f"replay_trace jobs={jobs}: {report.passes} passes in {elapsed:.2f} s = {report.passes / elapsed:.0f} passes/s "
              f"({len(report.divergences)} divergences)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
