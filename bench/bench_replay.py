"""Open-loop replay throughput against the bare sglang pass, same run.

Three figures on one synthetic trace (``bench.gen_trace``, realistic queue
and KV shapes):

* bare, per arm (its fixes on): ``Scheduler._get_new_batch_prefill_raw`` alone on state that is
  already built (the driver's stand-ins loaded, requests constructed), i.e.
  the cost of sglang's own decision; the floor no replay can beat;
* per arm: ``PassDriver.decide(pass, arm)`` for ``stock`` and ``fixed``,
  which also builds the requests and batch from the record; printed as
  passes/s and as a ratio over that arm's bare pass (target: <= 1.3x);
* whole trace: ``replay_trace`` end to end (two arms, fidelity, fix tagging
  of divergent passes, stalls), passes/s with 1 and 2 jobs.

Then the same bare and per-arm figures on every pass of every sample trace
(``traces/*.trace``, recorded by the sandbox; for the hybrid ones the driver
rebuilds their SWA and mamba pools, ``schedtrace.replay.hybrid``), bare being
sglang's pass on that rebuilt state; each pass as ``replay_trace`` gives it
(``replay_inputs``, the driver's book fed with the arrivals, finishes and
retractions before it, untimed), each figure the best of
``SAMPLE_ROUNDS`` runs over the trace (target: decide <= 1.3x bare); and each
sample replayed whole (``replay_trace``, both arms) at 1 and 2 jobs, best of
``SAMPLE_ROUNDS`` (target: >= 5,000 passes/s at 2 jobs). ``--no-samples``
skips them.

Run: ``python -m bench.bench_replay [--passes N] [--no-samples]``. Nothing here asserts.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
import warnings

from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV  # the contract imports no sglang

warnings.filterwarnings("ignore", category=UserWarning)
os.environ.setdefault(SGLANG_CPU_ENGINE_ENV, "1")


def _bare_seconds(driver, passes, arm: str = "stock") -> float:
    """sglang's pass on pre-built state under ``arm``'s fixes, nothing else in the timed region.

    Per arm: a fix changes how far sglang's own pass runs (stock returns early on a latched
    batch, the latch fix goes on to calc_priority), so each arm's floor is its own code."""
    from schedtrace.arms.variants import applied
    from schedtrace.replay.pass_standins import AdmissionDone, stop_init_new

    sched = driver.scheduler
    ScheduleBatch = driver._ScheduleBatch
    original = ScheduleBatch.__dict__["init_new"]
    policy = driver._policy_module
    recorded = {"mamba_prefill_chunk_grid": driver._grid_lookup, "_use_exact_chunk_fill": driver._exact_fill_lookup}
    saved = {name: policy.__dict__[name] for name in recorded}
    total = 0.0
    with driver._config.installed(), applied(arm):
        # The recorded mamba chunk grid and exact-fill gate, as decide() installs them.
        for name, lookup in recorded.items():
            setattr(policy, name, lookup)
        ScheduleBatch.init_new = classmethod(stop_init_new)
        try:
            for p in _noted(driver, passes):
                waiting, batch, chunked = driver._load(p)
                sched.waiting_queue, sched.chunked_req = waiting, chunked
                sched.chunked_prefill_size = p.chunked_prefill_size
                sched.new_token_ratio_tracker.current = p.new_token_ratio
                start = time.perf_counter()
                try:
                    sched._get_new_batch_prefill_raw(None, batch)
                except AdmissionDone:
                    pass
                except Exception:
                    pass
                total += time.perf_counter() - start
        finally:
            ScheduleBatch.init_new = original
            for name, value in saved.items():
                setattr(policy, name, value)
    return total


def _decide_seconds(driver, passes, arm: str) -> float:
    decide, clock = driver.decide, time.perf_counter
    total = 0.0
    for p in _noted(driver, passes):
        start = clock()
        decide(p, arm)
        total += clock() - start
    return total


def _noted(driver, items):
    """The passes of ``items`` in order, the driver's book fed as ``replay_trace`` feeds it.

    ``items``: passes, or (records to note before it, pass) pairs (``_trace_items``). Untimed:
    a pass's priorities, prefix ids and queue entry times come from the arrivals before it."""
    note = driver.note
    for item in items:
        if type(item) is not tuple:
            yield item
            continue
        before, p = item
        for record in before:
            note(record)
        yield p
        note(p)  # after the pass: its preemption releases re-queue


def _arm_line(label: str, arm: str, n: int, elapsed: float, bare: float) -> str:
    return (f"{label}[{arm:5}]: {n / elapsed:10.0f} passes/s  "
            f"({elapsed / n * 1e6:.1f} us/pass, {elapsed / bare:.2f}x bare)")


def _warm_driver(header, first):
    """A driver whose patches are compiled and imports done (both arms once)."""
    from schedtrace.replay.driver import PassDriver
    from schedtrace.replay.pass_standins import Ratio as _Ratio

    driver = PassDriver(header)
    first = next(_noted(driver, [first]))
    driver.decide(first, "stock")
    driver.decide(first, "fixed")
    driver.scheduler.new_token_ratio_tracker = _Ratio(0.0)
    return driver


SAMPLE_ROUNDS = 5  # a few hundred to 1,500 passes each: every figure is the best of this many runs over the trace


def bench_samples() -> None:
    """Bare pass and replay per pass on every pass of each sample trace, then each replayed whole."""
    from schedtrace.replay.engine import replay_trace

    traces = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces")
    for path in sorted(glob.glob(os.path.join(traces, "*.trace"))):
        header, passes = _trace_items(path)
        driver = _warm_driver(header, passes[0])
        # Rounds interleaved (bare, stock, fixed, bare, ...): each figure's best sees the same neighbours.
        best = {name: float("inf") for name in ("bare stock", "bare fixed", "stock", "fixed")}
        for _ in range(SAMPLE_ROUNDS):
            for arm in ("stock", "fixed"):
                best[f"bare {arm}"] = min(best[f"bare {arm}"], _bare_seconds(driver, passes, arm))
                best[arm] = min(best[arm], _decide_seconds(driver, passes, arm))
        pools = header.pools
        shape = "full pool" if pools is None else f"{pools.allocator}, mamba slots {pools.mamba_size}, swa {pools.swa_size}"
        print(f"{os.path.basename(path)} ({header.server_args.schedule_policy}, {shape}): {len(passes)} pass records")
        for arm in ("stock", "fixed"):
            bare = best[f"bare {arm}"]
            print(f"  bare sglang pass[{arm:5}] (rebuilt state): {len(passes) / bare:10.0f} passes/s  "
                  f"({bare / len(passes) * 1e6:.1f} us/pass)")
            print(_arm_line("  PassDriver.decide", arm, len(passes), best[arm], bare))
        bare = best["bare stock"] + best["bare fixed"]
        for jobs in (1, 2):
            elapsed = min(_whole_seconds(replay_trace, path, jobs) for _ in range(SAMPLE_ROUNDS))
            print(f"  replay_trace jobs={jobs}: {len(passes) / elapsed:7.0f} passes/s "
                  f"({elapsed / len(passes) * 1e6:.0f} us/pass, {elapsed / bare:.2f}x the two arms' bare passes)")


def _trace_items(path: str):
    """(header, [(records to note before the pass, the pass as replay reads it)]) of a trace."""
    from schedtrace.tracer.analysis.decision import replay_inputs
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.contract.schema import Arrival, Finish, Pass, Retract

    items, before = [], []
    with TraceReader(path) as reader:
        for _, record in reader.records():
            kind = type(record)
            if kind is Pass:
                items.append((tuple(before), replay_inputs(record)))
                before = []
            elif kind is Arrival or kind is Finish or kind is Retract:
                before.append(record)
        return reader.header, items


def _whole_seconds(replay_trace, path: str, jobs: int) -> float:
    start = time.perf_counter()
    replay_trace(path, "stock", "fixed", jobs=jobs)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    passes_wanted = int(argv[argv.index("--passes") + 1]) if "--passes" in argv else 6000
    from schedtrace.testing.synthetic import generate
    from schedtrace.replay.engine import replay_trace
    from schedtrace.tracer.contract.format import TraceReader

    work = tempfile.mkdtemp(prefix="schedtrace-bench-replay-")
    path = os.path.join(work, "bench.trace")
    generate(path, passes_wanted, seed=7)
    with TraceReader(path) as reader:
        header = reader.header
        passes = list(reader.passes())
    sample = passes[: min(len(passes), 3000)]
    driver = _warm_driver(header, sample[0])

    print(f"trace: {len(passes)} pass records; timing {len(sample)} of them")
    for arm in ("stock", "fixed"):
        bare = _bare_seconds(driver, sample, arm)
        print(f"bare sglang pass[{arm:5}] (pre-built state): {len(sample) / bare:10.0f} passes/s  "
              f"({bare / len(sample) * 1e6:.1f} us/pass)")
        print(_arm_line("PassDriver.decide", arm, len(sample), _decide_seconds(driver, sample, arm), bare))
    for jobs in (1, 2):
        start = time.perf_counter()
        report = replay_trace(path, "stock", "fixed", jobs=jobs)
        elapsed = time.perf_counter() - start
        print(f"replay_trace jobs={jobs}: {report.passes} passes in {elapsed:.2f} s = {report.passes / elapsed:.0f} passes/s "
              f"({len(report.divergences)} divergences)")
    if "--no-samples" not in argv:
        bench_samples()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
