"""Recorder cost per scheduling pass, against a pass-through hook, same run.

Runs the real ``Scheduler._get_new_batch_prefill_raw`` (and the real
``PrefillAdder``/``PrefillBudget`` it builds) on a scheduler that
``schedtrace.replay.driver.PassDriver`` sets up from one pass record: real ``Req``
objects, a real ``ScheduleBatch``, real policy. The scheduler itself is
``Scheduler.__new__`` with the attributes the pass reads (no model, no
forward). The rig (``schedtrace.testing.rig``) wraps every hook point
of the pass as HookRegistry's AROUND wrapper does (``targets.PASS_TARGETS``:
the pass, the adder and budget methods, the allocator methods and the tree
caches' ``lock``). Three arms:

* bare: sglang's functions, no hook;
* pass-through: an AROUND hook that only calls through (the baseline);
* recorder: the recorder's hooks, writing to a real ``WriterThread``.

Cases (32 waiting, 12 running unless said):

* idle pass: empty waiting queue, no chunked request;
* latched, folded: the running batch is full, so sglang returns at once
  (its ``batch_is_full`` early return); the inputs repeat, so the recorder
  folds every pass into one record;
* latched, written: the same, but free KV changes every pass, so every pass
  is a record the writer thread builds and writes;
* admitting: the full admission path (prefix match, ``add_one_req`` per
  candidate, a truncated chunk, queue update, prefill stats) admits 6
  requests (the sixth as that chunk), on ``schedtrace.replay.state``'s stand-ins for
  the KV allocator, the prefix cache and the request-slot pool.
  ``ScheduleBatch.init_new`` is swapped for a light object (it would build
  tensors), so nothing is allocated, the recorder's allocator hooks never
  fire, and the bare pass is cheaper than a live one, which makes the ratio
  stricter;
* admitting, real pools: the rig's ``RealPools`` (real request-slot pool,
  KV pool, allocator and radix tree; the pass admits 8, 4 on a cached
  prompt). The real ``init_new`` and ``prepare_for_extend`` run: request
  rows and KV are allocated (the recorder writes an ``Alloc`` record per
  pass), the req_to_token rows written, the sampling info built.

Both admitting cases rebuild their state before every timed call, outside the
timed region and with no hook installed, and empty the young GC generation,
so every call does the same work; the arms take turns and each reports its
median. The real-pools case is the loaded pass the recorder's "+5% at most"
target is about; the stand-in case has the same recorder work over a pass
that builds no batch.

Prints ns per pass, the recorder's extra ns over the pass-through baseline
(the admitting cases: median of per-round paired differences), the ratio
1 + extra / pass-through, trace bytes per written pass, and the ``Alloc``
records the trace holds (all from the real-pools case). The same cases on
sglang's hybrid (mamba, SWA) pools: ``bench.bench_hybrid``. Run:
``python -m bench.bench_recorder``. Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from schedtrace.tracer.contract.names import SGLANG_CPU_ENGINE_ENV  # the contract imports no sglang
os.environ.setdefault(SGLANG_CPU_ENGINE_ENV, "1")

from schedtrace.replay.sglang_env import ensure_sglang_importable  # noqa: E402

ensure_sglang_importable()

from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402

from schedtrace.replay.driver import PassDriver  # noqa: E402
from schedtrace.replay.state import RecordedAllocator  # noqa: E402
from schedtrace.tracer.contract.format import TraceReader  # noqa: E402
from schedtrace.tracer.contract.schema import Alloc  # noqa: E402
from schedtrace.tracer.recorder.hooks import make_hooks  # noqa: E402
from schedtrace.tracer.recorder.lifecycle import Recorder  # noqa: E402
from schedtrace.testing.rig import (  # noqa: E402
    RUNNING,
    WAITING,
    HookPoints,
    Points,
    RealPools,
    attributes,
    header,
    idle_pass,
    load,
    loaded_pass,
    prepare_scheduler,
    server_args,
)
from schedtrace.tracer.recorder.writer_thread import WriterThread  # noqa: E402

ADMITTING_CALLS = 300  # timed calls per arm in each admitting case
IDLE_CALLS = 200_000  # calls per timed loop of the idle case
T = TypeVar("T")

Arms = tuple[tuple[str, Points], ...]


class _LightBatch:
    """What the pass touches on the batch ``ScheduleBatch.init_new`` returns."""

    def __init__(self, reqs) -> None:
        self.reqs = reqs

    def prepare_for_extend(self) -> None:
        pass


def _light_init_new(cls, reqs, *args, **kwargs):
    return _LightBatch(reqs)


@contextlib.contextmanager
def light_init_new() -> Iterator[None]:
    original = ScheduleBatch.__dict__["init_new"]
    ScheduleBatch.init_new = classmethod(_light_init_new)
    try:
        yield
    finally:
        ScheduleBatch.init_new = original


class _VaryingAllocator(RecordedAllocator):
    """Free KV drops by one token each time it is read: no two passes fold."""

    def available_size(self) -> int:
        self.available -= 1
        return self.available


def loop_ns(s, batch, n: int, repeats: int = 5) -> float:
    """Best of ``repeats`` of the mean ns per call over ``n`` calls."""
    fn = Scheduler._get_new_batch_prefill_raw
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn(s, None, batch)
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def looped(points: HookPoints, arms: Arms, s, batch, n: int, repeats: int = 5) -> dict[str, float]:
    """Per arm, the best of ``repeats`` timed loops of ``n`` calls on the same state;
    the arms take turns, so drift of a shared machine reaches each of them alike."""
    times = {name: float("inf") for name, _ in arms}
    for _ in range(repeats):
        for name, arm in arms:
            with points.hooked(arm):
                times[name] = min(times[name], loop_ns(s, batch, n, repeats=1))
    return times


def interleaved_medians(
    points: HookPoints, arms: Arms, prepare: Callable[[], tuple[Any, Any]], n: int,
    after_recorder: Callable[[], None],
) -> tuple[dict[str, float], list]:
    """Median ns per arm of one pass on fresh state; the arms take turns.

    ``prepare`` returns (scheduler, running batch) for one call; it runs with
    no hook installed, so its own allocations reach no hook and are not
    timed. ``after_recorder`` runs after each recorder call (the writer's
    drain), also untimed. Returns the medians, plus ``"extra"``: the median of
    the per-round differences recorder minus pass-through (pairing the calls
    of one round cancels the machine's drift between rounds), and the first
    pass's admitted list.
    """
    samples: dict[str, list[int]] = {name: [] for name, _ in arms}
    admitted: list = []
    try:
        for i in range(n):
            turn = i % len(arms)
            for name, arm in arms[turn:] + arms[:turn]:
                points.restore()
                s, batch = prepare()
                gc.collect(0)  # every call starts with an empty young generation
                points.install(arm)
                fn = Scheduler._get_new_batch_prefill_raw
                start = time.perf_counter_ns()
                new_batch, _ = fn(s, None, batch)
                samples[name].append(time.perf_counter_ns() - start)
                points.restore()
                if name == "recorder":
                    after_recorder()
                if i == 0 and not admitted:
                    admitted = list(new_batch.reqs)
    finally:
        points.restore()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    medians["extra"] = statistics.median(r - p for r, p in zip(samples["recorder"], samples["pass-through"]))
    return medians, admitted


# --- the run ---------------------------------------------------------------------


class TraceStats:
    """Drains the recorder's writer outside the timed regions and measures
    what one written pass costs it (bytes, and writer-thread ns)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.bytes_per_pass: dict[str, float] = {}
        self.writer_ns: dict[str, float] = {}
        self._drain_ns = 0

    def drain(self) -> None:
        start = time.perf_counter_ns()
        self.rec.writer.drain()
        self._drain_ns += time.perf_counter_ns() - start

    def written(self, case: str, run: Callable[[], T]) -> T:
        """``run()``, noting the bytes and writer time per pass it wrote."""
        rec, writer = self.rec, self.rec.writer
        rec.flush()
        writer.drain()
        size, seq = writer.bytes_written, writer.next_pass_seq
        self._drain_ns = 0
        result = run()
        rec.flush()
        self.drain()
        passes = max(writer.next_pass_seq - seq, 1)
        self.bytes_per_pass[case] = (writer.bytes_written - size) / passes
        self.writer_ns[case] = self._drain_ns / passes
        return result


def started_recorder(out: str, stem: str, make_header: Callable) -> tuple[Recorder, TraceStats]:
    """A recording ``Recorder`` whose writer drains only when told to, outside the
    timed regions; its own time per written pass (build + encode + write) is reported apart."""
    rec = Recorder(out)
    rec.start(WriterThread(out, stem, make_header, clock_ns=rec.now, flush_interval_s=3600))
    return rec, TraceStats(rec)


def recorder_arms(points: HookPoints, rec: Recorder) -> Arms:
    return (("bare", points.bare), ("pass-through", points.passing_through()),
            ("recorder", points.wrapped(dict(make_hooks(rec)))))


def main() -> None:
    out = tempfile.mkdtemp(prefix="schedtrace-bench-")
    rec, trace = started_recorder(out, "bench", lambda p, f: header())
    points = HookPoints()
    arms = recorder_arms(points, rec)
    driver = PassDriver(header())
    prepare_scheduler(driver)
    rows: list[tuple[str, dict[str, float]]] = []

    with driver._config.installed():
        # idle
        s, batch = load(driver, idle_pass())
        rows.append(("idle pass", looped(points, arms, s, batch, IDLE_CALLS)))

        # latched, folded and written
        s, batch = load(driver, loaded_pass(batch_full=True))
        rows.append(("latched, folded", looped(points, arms, s, batch, 20_000)))

        varying = _VaryingAllocator(400_000, 1)
        varying.available = 10**9
        s.token_to_kv_pool_allocator = varying
        times = {}
        for name, arm in arms:
            with points.hooked(arm):
                if name == "recorder":
                    times[name] = trace.written("latched, written", lambda: loop_ns(s, batch, 5_000))
                else:
                    times[name] = loop_ns(s, batch, 5_000)
        s.token_to_kv_pool_allocator = driver.allocator
        rows.append(("latched, written", times))

        # admitting (stand-ins): fresh state per call, arms interleaved, median per arm
        record = loaded_pass(batch_full=False)
        with light_init_new():
            times, stubbed_admitted = trace.written("admitting", lambda: interleaved_medians(
                points, arms, lambda: load(driver, record), ADMITTING_CALLS, trace.drain))
        rows.append(("admitting", times))

        # admitting on real pools, the same way
        pools = RealPools(server_args(), header().max_req_slots)
        s = driver.scheduler
        with attributes(s, pools.scheduler_attributes(s)):
            times, real_admitted = trace.written("admitting, real pools", lambda: interleaved_medians(
                points, arms, lambda: (s, pools.reset(s)), ADMITTING_CALLS, trace.drain))
        rows.append(("admitting, real pools", times))
    rec.close()

    hits = sum(1 for r in real_admitted if r.prefix_len > 0)
    print(f"{WAITING} waiting, {RUNNING} running; admitting pass admits {len(stubbed_admitted)} requests; "
          f"on real pools {len(real_admitted)} ({hits} on a cached prefix)")
    print_table(rows, trace)
    print_trace_summary(rec.writer.paths)


def print_table(rows: list[tuple[str, dict[str, float]]], trace: TraceStats, width: int = 22) -> None:
    """One line per case: ns per arm, the recorder's extra ns and the ratio over pass-through."""
    print(f"{'case':{width}} {'bare ns':>10} {'pass-thru ns':>13} {'recorder ns':>12} {'extra ns':>9} {'ratio':>7}")
    for name, t in rows:
        base, recd = t["pass-through"], t["recorder"]
        extra = t.get("extra", recd - base)
        print(f"{name:{width}} {t['bare']:10.0f} {base:13.0f} {recd:12.0f} {extra:9.0f} {1 + extra / base:7.3f}")
    for case, size in trace.bytes_per_pass.items():
        print(f"written pass, {case}: {size:.0f} trace bytes; writer thread {trace.writer_ns[case]:.0f} ns "
              f"(build + encode + write, off the scheduler thread)")


def print_trace_summary(paths: list) -> None:
    allocs: list[Alloc] = []
    for path in paths:
        with TraceReader(path) as reader:
            allocs += [r for _, r in reader.records() if isinstance(r, Alloc)]
    with TraceReader(paths[0]) as reader:
        counts = reader.footer.counts
        print(f"trace file: {reader.file_size} bytes, {reader.pass_count} pass records, "
              f"idle_passes={counts.get('idle_passes')}, lost={counts.get('lost')}, "
              f"build_errors={counts.get('build_errors', 0)}")
    # Only the real-pools case allocates: the stand-in allocator is no hooked class.
    failed = sum(1 for a in allocs if not a.ok)
    print(f"alloc records (real pools only, {ADMITTING_CALLS} recorder passes): {len(allocs)}, failed {failed}, "
          f"ops {sorted({a.op for a in allocs})}, tokens asked per call {sorted({a.requested for a in allocs})}")


if __name__ == "__main__":
    main()
