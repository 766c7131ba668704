"""What recording a request's prefix ids costs: the scheduler thread, the writer thread, the bytes.

Real sglang ``Req``s with 8k-token prompts (and 1k, 32k) go through the
recorder's arrival path (``Recorder.on_arrival``: the scheduler thread only
queues an ``ArrivalCapture``), and the writer thread builds the ``Arrival``
(``build()``: the keyed BLAKE2b chain). Baselines measured in the same run:
the arrival as the recorder wrote it before ids (an ``Arrival`` Struct built
on the scheduler thread, lengths only), and one bare admitting pass of
``bench.bench_recorder``'s stand-in case is quoted by that bench.

Prints ns per arrival on the scheduler thread (now against before), the
writer thread's ns per arrival (now against before) and per 1k tokens, and
the encoded bytes per request with and without ids. Then the issue's budget: one
admitting pass on real pools (``bench.bench_recorder``'s case, measured here)
with as many 8k-token arrivals as it admits, as a ratio to the pass-through
pass: ``1 + (recorder extra + arrivals x scheduler ns per arrival) / pass``,
with ids and as before them. Nothing is asserted.
Run: ``python -m bench.bench_prefix_ids``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from array import array

from schedtrace.replay.sglang_env import ensure_sglang_importable

ensure_sglang_importable()

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from schedtrace.tracer.contract.codec import encode  # noqa: E402
from schedtrace.tracer.contract.schema import Arrival  # noqa: E402
from schedtrace.tracer.recorder.arrival import ArrivalCapture  # noqa: E402
from schedtrace.tracer.recorder.lifecycle import Recorder  # noqa: E402

ROUNDS = 7
PER_ROUND = 200
LENGTHS = (1024, 8192, 32768)
BUDGET_PROMPT = 8192  # the budget: the admitting pass with 8k-token prompts arriving


def _reqs(n: int, length: int) -> list:
    out = []
    for k in range(n):
        ids = array("q", range(k, k + length))
        req = Req(f"r{length}-{k}", "", ids, SamplingParams(max_new_tokens=64))
        req.priority = None
        out.append(req)
    return out


def _best(fn, items) -> float:
    """Median over rounds of ns per item."""
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter_ns()
        for item in items:
            fn(item)
        samples.append((time.perf_counter_ns() - start) / len(items))
    return statistics.median(samples)


def main() -> None:
    rec = Recorder(tempfile.mkdtemp(prefix="schedtrace-bench-ids-"))
    rec.prefix_block = 16
    key = rec.prefix_key
    queued: list = []
    rec._queue = queued.append  # the arrival path up to the writer's queue, no writer thread
    print(f"{'prompt':>8} {'sched ns now':>13} {'before':>8} {'ratio':>6} {'writer ns now':>14} {'before':>8} "
          f"{'ratio':>7} {'ns/1k tok':>9} {'B/request now':>14} {'before':>7}")
    for length in LENGTHS:
        reqs = _reqs(PER_ROUND, length)

        def before_sched(req):  # what on_arrival did before ids: the row, on the scheduler thread
            params = req.sampling_params
            return Arrival(0, req.rid, len(req.origin_input_ids), params.max_new_tokens, req.priority,
                           bool(params.ignore_eos))

        def now_sched(req):
            rec._live_rids.discard(req.rid)
            rec.on_arrival(req, False)

        sched_now, sched_before = _best(now_sched, reqs), _best(before_sched, reqs)
        captures = [ArrivalCapture(0, req, key, 16, 0) for req in reqs]
        writer_now = _best(lambda c: encode(c.build()), captures)
        writer_before = _best(lambda r: encode(before_sched(r)), reqs)
        bytes_now = len(encode(captures[0].build()))
        bytes_before = len(encode(before_sched(reqs[0])))
        print(f"{length:8d} {sched_now:13.0f} {sched_before:8.0f} {sched_now / sched_before:6.2f} "
              f"{writer_now:14.0f} {writer_before:8.0f} {writer_now / writer_before:7.1f} "
              f"{writer_now / length * 1000:9.0f} {bytes_now:14d} {bytes_before:7d}")
        queued.clear()
        if length == BUDGET_PROMPT:
            per_arrival = (sched_now, sched_before)
    admitting_budget(*per_arrival)


def admitting_budget(arrival_now: float, arrival_before: float) -> None:
    """The admitting pass on real pools with its arrivals' scheduler-thread cost added."""
    from bench import bench_recorder as br
    from schedtrace.replay.driver import PassDriver
    from schedtrace.testing import rig

    out = tempfile.mkdtemp(prefix="schedtrace-bench-ids-pass-")
    rec, trace = br.started_recorder(out, "bench", lambda p, f: rig.header())
    points = rig.HookPoints()
    arms = br.recorder_arms(points, rec)
    driver = PassDriver(rig.header())
    rig.prepare_scheduler(driver)
    with driver._config.installed():
        pools = rig.RealPools(rig.server_args(), rig.header().max_req_slots)
        s = driver.scheduler
        with rig.attributes(s, pools.scheduler_attributes(s)):
            times, admitted = br.interleaved_medians(points, arms, lambda: (s, pools.reset(s)), br.ADMITTING_CALLS,
                                                     trace.drain)
    rec.close()
    k, base = len(admitted), times["pass-through"]
    for label, arrival in (("with ids", arrival_now), ("before ids", arrival_before)):
        extra = times["extra"] + k * arrival
        print(f"admitting pass ({k} admitted, {k} {BUDGET_PROMPT}-token arrivals), {label}: "
              f"{1 + extra / base:.3f}x (+{extra / 1000:.1f} us on {base / 1000:.0f} us)")


if __name__ == "__main__":
    main()
