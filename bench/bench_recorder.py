"""Recorder cost per scheduling pass, against a pass-through hook, same run.

Runs the real ``Scheduler._get_new_batch_prefill_raw`` (and the real
``PrefillAdder``/``PrefillBudget`` it builds) on a scheduler that
``replay.driver.PassDriver`` sets up from one pass record: real ``Req``
objects, a real ``ScheduleBatch``, real policy; stand-ins only for the KV
allocator, the prefix cache and the request-slot pool (``replay.state``).
Three arms, every hook point of the pass wrapped by HookRegistry's AROUND
wrapper in the last two:

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
  candidate, a truncated chunk, queue update, prefill stats) admits 5
  requests. Only ``ScheduleBatch.init_new`` is swapped for a light object
  (it would build tensors), which makes the bare pass cheaper and the ratio
  stricter. State is rebuilt before each call, outside the timed region.

Prints ns per pass, the recorder's extra ns over the pass-through baseline,
the ratio, and trace bytes per written pass. Run:
``python -m bench.bench_recorder``. Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from replay.sglang_env import ensure_sglang_importable  # noqa: E402

ensure_sglang_importable()

from sglang.srt.managers.schedule_batch import ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import PrefillAdder  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache import prefill_budget  # noqa: E402
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn  # noqa: E402

from replay.driver import PassDriver  # noqa: E402
from replay.state import RecordedAllocator  # noqa: E402
from tracer.format import TraceReader  # noqa: E402
from tracer.recorder import BUDGET_CLASSES, SCHED, Recorder, make_hooks  # noqa: E402
from tracer.schema import Header, KvSnapshot, Pass, RunningReq, ServerArgs, WaitingReq  # noqa: E402
from tracer.writer_thread import WriterThread  # noqa: E402

WAITING, RUNNING = 32, 12

# (owner, attribute, dotted hook target) of every hook point a pass runs through.
PASS_POINTS: list[tuple[object, str, str]] = [
    (Scheduler, "_get_new_batch_prefill_raw", f"{SCHED}._get_new_batch_prefill_raw"),
    (PrefillAdder, "add_one_req", "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"),
    (PrefillAdder, "add_chunked_req", "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"),
    *[
        (getattr(prefill_budget, cls), "available_chunk_tokens",
         f"sglang.srt.mem_cache.prefill_budget.{cls}.available_chunk_tokens")
        for cls in BUDGET_CLASSES
    ],
]


def pass_through(fn, *args, **kwargs):
    return fn(*args, **kwargs)


ORIGINALS = [(owner, name, owner.__dict__[name]) for owner, name, _ in PASS_POINTS if name in owner.__dict__]


def wrapped_for(hooks: dict[str, Callable] | None) -> list[tuple[object, str, Callable]]:
    """Every pass hook point wrapped as HookRegistry would (None: bare)."""
    targets = {(owner, name): target for owner, name, target in PASS_POINTS}
    if hooks is None:
        return ORIGINALS
    return [
        (owner, name, _wrap_fn(fn, pass_through if hooks is PASS_THROUGH else hooks[targets[owner, name]],
                               HookType.AROUND))
        for owner, name, fn in ORIGINALS
    ]


def install(points: list[tuple[object, str, Callable]]) -> None:
    for owner, name, fn in points:
        setattr(owner, name, fn)


@contextlib.contextmanager
def hooked(points: list[tuple[object, str, Callable]]) -> Iterator[None]:
    install(points)
    try:
        yield
    finally:
        install(ORIGINALS)


PASS_THROUGH: dict[str, Callable] = {}


class _LightBatch:
    """What the pass touches on the batch ``ScheduleBatch.init_new`` returns."""

    def __init__(self, reqs) -> None:
        self.reqs = reqs

    def prepare_for_extend(self) -> None:
        pass


def _light_init_new(cls, reqs, *args, **kwargs):
    return _LightBatch(reqs)


class _VaryingAllocator(RecordedAllocator):
    """Free KV drops by one token each time it is read: no two passes fold."""

    def available_size(self) -> int:
        self.available -= 1
        return self.available


def server_args() -> ServerArgs:
    return ServerArgs("fcfs", 8192, 16384, 1, 48, 400_000, "torch_native", "bench")


def header() -> Header:
    return Header(1, "?", "?", "bench", 0, 0, None, 0, server_args(), max_req_slots=64)


def loaded_pass(batch_full: bool) -> Pass:
    waiting = [WaitingReq(f"w-{i:03d}", 1500 + 37 * i, 0, 256, 0, None, True) for i in range(WAITING)]
    running = [RunningReq(f"r-{i:03d}", 2000 + 11 * i, 1 + 5 * i, 256, True) for i in range(RUNNING)]
    return Pass(0, 0, 0, 1, 0, waiting, running, None, batch_full, KvSnapshot(300_000, 512), 40, 0.7, 8192,
                [], [], None, None, batch_full)


def prepare_scheduler(driver: PassDriver) -> None:
    """Attributes the admitting path reads after ``init_new``."""
    s = driver.scheduler
    s.hisparse_coordinator = None
    s.enable_hierarchical_cache = False
    s.enable_unified_cache_external_linker = False
    s.enable_priority_scheduling = False
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)


def load(driver: PassDriver, record: Pass):
    waiting, batch, chunked = driver._load(record)
    s = driver.scheduler
    s.waiting_queue = waiting
    s.chunked_req = chunked
    s.chunked_prefill_size = record.chunked_prefill_size
    s.new_token_ratio_tracker = SimpleNamespace(current=record.new_token_ratio)
    return s, batch


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


def main() -> None:
    out = tempfile.mkdtemp(prefix="schedtrace-bench-")
    # The writer drains only when told to, outside the timed regions, and its
    # own time per written pass (build + encode + write) is reported apart.
    rec = Recorder(out)
    rec.writer = WriterThread(out, "bench", lambda p, f: header(), clock_ns=rec.now, flush_interval_s=3600)
    recorder_hooks = dict(make_hooks(rec))
    arms = tuple((name, wrapped_for(hooks)) for name, hooks in
                 (("bare", None), ("pass-through", PASS_THROUGH), ("recorder", recorder_hooks)))
    driver = PassDriver(header())
    prepare_scheduler(driver)
    rows: list[tuple[str, dict[str, float]]] = []
    bytes_per_pass: dict[str, float] = {}
    writer_ns: dict[str, float] = {}
    drain_ns = [0]

    def drain() -> None:
        start = time.perf_counter_ns()
        rec.writer.drain()
        drain_ns[0] += time.perf_counter_ns() - start

    def written(case: str, run: Callable[[], None]) -> None:
        rec._flush_held()
        rec.writer.drain()
        size, seq = rec.writer._writer.size, rec.writer.next_pass_seq
        drain_ns[0] = 0
        run()
        rec._flush_held()
        drain()
        passes = max(rec.writer.next_pass_seq - seq, 1)
        bytes_per_pass[case] = (rec.writer._writer.size - size) / passes
        writer_ns[case] = drain_ns[0] / passes

    with driver._config.installed():
        # idle
        s, batch = load(driver, Pass(0, 0, 0, 1, 0, [], [], None, False, KvSnapshot(1000, 0), 40, 0.7, 8192,
                                     [], [], None, None, False))
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                times[name] = loop_ns(s, batch, 200_000)
        rows.append(("idle pass", times))

        # latched, folded and written
        s, batch = load(driver, loaded_pass(batch_full=True))
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                times[name] = loop_ns(s, batch, 20_000)
        rows.append(("latched, folded", times))

        varying = _VaryingAllocator(400_000, 1)
        varying.available = 10**9
        s.token_to_kv_pool_allocator = varying
        times = {}
        for name, hooks in arms:
            with hooked(hooks):
                if name == "recorder":
                    written("latched, written", lambda: times.__setitem__(name, loop_ns(s, batch, 5_000)))
                else:
                    times[name] = loop_ns(s, batch, 5_000)
        s.token_to_kv_pool_allocator = driver.allocator
        rows.append(("latched, written", times))

        # admitting: fresh state per call, arms interleaved, median per arm
        record = loaded_pass(batch_full=False)
        samples: dict[str, list[int]] = {name: [] for name, _ in arms}
        points_by_arm = dict(arms)
        original_init_new = ScheduleBatch.__dict__["init_new"]
        ScheduleBatch.init_new = classmethod(_light_init_new)
        admitted = []

        def admitting_runs(n: int) -> None:
            for i in range(n):
                for name, _ in arms[i % 3:] + arms[: i % 3]:
                    s, batch = load(driver, record)
                    install(points_by_arm[name])
                    fn = Scheduler._get_new_batch_prefill_raw
                    start = time.perf_counter_ns()
                    new_batch, _ = fn(s, None, batch)
                    samples[name].append(time.perf_counter_ns() - start)
                    if name == "recorder":
                        drain()
                    if i == 0:
                        admitted.append(len(new_batch.reqs))

        try:
            written("admitting", lambda: admitting_runs(300))
        finally:
            ScheduleBatch.init_new = original_init_new
            install(ORIGINALS)
        rows.append(("admitting", {name: statistics.median(v) for name, v in samples.items()}))
    rec.close()

    print(f"{WAITING} waiting, {RUNNING} running; admitting pass admits {admitted[0]} requests")
    print(f"{'case':20} {'bare ns':>10} {'pass-thru ns':>13} {'recorder ns':>12} {'extra ns':>9} {'ratio':>7}")
    for name, t in rows:
        base, recd = t["pass-through"], t["recorder"]
        print(f"{name:20} {t['bare']:10.0f} {base:13.0f} {recd:12.0f} {recd - base:9.0f} {recd / base:7.3f}")
    for case, size in bytes_per_pass.items():
        print(f"written pass, {case}: {size:.0f} trace bytes; writer thread {writer_ns[case]:.0f} ns "
              f"(build + encode + write, off the scheduler thread)")
    with TraceReader(rec.writer.paths[0]) as reader:
        counts = reader.footer.counts
        print(f"trace file: {reader.file_size} bytes, {reader.pass_count} pass records, "
              f"idle_passes={counts.get('idle_passes')}, lost={counts.get('lost')}, "
              f"build_errors={counts.get('build_errors', 0)}")


if __name__ == "__main__":
    main()
