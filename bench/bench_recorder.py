"""Recorder cost per scheduling pass, against a pass-through hook, same run.

Drives the real ``Scheduler._get_new_batch_prefill_raw`` (sglang's own
function) through HookRegistry's AROUND wrapper, once with a pass-through
hook (the baseline) and once with the recorder's pass hook, on a stubbed
scheduler that holds only what the pass reads before it returns:

* idle pass: empty waiting queue, no chunked request;
* loaded pass, folded: 32 waiting, 12 running, batch full -> rejected; the
  inputs repeat, so the recorder folds them (snapshot + compare only);
* loaded pass, written: the same, but free KV changes every pass, so every
  pass becomes a record the writer thread encodes and writes.

Prints ns per pass, the recorder's extra ns over the baseline, the ratio,
and trace bytes per written pass. Run: ``python -m bench.bench_recorder``.
"""

from __future__ import annotations

import os
import tempfile
import time
from types import SimpleNamespace

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def _req(i: int) -> SimpleNamespace:
    return SimpleNamespace(
        rid=f"req-{i:04d}", origin_input_ids=[0] * (1500 + 37 * i), output_ids=[0] * (i % 7),
        sampling_params=SimpleNamespace(max_new_tokens=256, ignore_eos=True),
        prefix_len=0, priority=None,
    )


class _Kv:
    def __init__(self) -> None:
        self.free = 20000
        self.vary = False

    def available_size(self) -> int:
        if self.vary:
            self.free -= 1
        return self.free


def stub_scheduler(waiting: int, running: int, batch_full: bool):
    scheduler = SimpleNamespace(
        grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False),
        enable_priority_preemption=False, is_hybrid_swa=False,
        waiting_queue=[_req(i) for i in range(waiting)], chunked_req=None,
        token_to_kv_pool_allocator=_Kv(),
        tree_cache=SimpleNamespace(supports_mamba=lambda: False, evictable_size=lambda: 512),
        req_to_token_pool=SimpleNamespace(available_size=lambda: 0),
        new_token_ratio_tracker=SimpleNamespace(current=0.7),
        chunked_prefill_size=8192, dynamic_chunk_sizer=None,
    )
    reqs = [_req(1000 + i) for i in range(running)]
    batch = SimpleNamespace(reqs=reqs, batch_is_full=batch_full, is_empty=lambda: not reqs)
    return scheduler, batch


def per_call_ns(fn, scheduler, batch, n: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn(scheduler, prefill_delayer_single_pass=None, running_batch=batch)
        best = min(best, (time.perf_counter_ns() - start) / n)
    return best


def main() -> None:
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    from tracer.format import TraceReader
    from tracer.recorder import SCHED, Recorder, make_hooks
    from tracer.schema import Header, ServerArgs
    from tracer.writer_thread import WriterThread

    original = Scheduler._get_new_batch_prefill_raw
    baseline = _wrap_fn(original, lambda fn, *a, **k: fn(*a, **k), HookType.AROUND)
    out = tempfile.mkdtemp(prefix="schedtrace-bench-")
    rec = Recorder(out, flush_interval_s=0.05)
    args = ServerArgs("fcfs", 8192, 16384, 1, 12, 40000, "torch_native", "bench")
    rec.writer = WriterThread(out, "bench", lambda p, f: Header(1, "?", "?", "bench", 0, 0, None, 0, args, p, f),
                              clock_ns=rec.now, flush_interval_s=0.05)
    recorded = _wrap_fn(original, dict(make_hooks(rec))[f"{SCHED}._get_new_batch_prefill_raw"], HookType.AROUND)

    rows = []
    idle = stub_scheduler(0, 0, False)
    n = 200_000
    rows.append(("idle pass", per_call_ns(original, *idle, n), per_call_ns(baseline, *idle, n), per_call_ns(recorded, *idle, n)))

    loaded = stub_scheduler(32, 12, True)
    n = 5_000
    rows.append(("loaded pass, folded", per_call_ns(original, *loaded, n), per_call_ns(baseline, *loaded, n),
                 per_call_ns(recorded, *loaded, n)))

    loaded[0].token_to_kv_pool_allocator.vary = True
    size_before = rec.writer._writer.size
    written_before = rec.writer.next_pass_seq
    base_ns = per_call_ns(baseline, *loaded, n)
    rec_ns = per_call_ns(recorded, *loaded, n)
    rec._flush_held()
    rec.writer.wait_idle(30)
    written = rec.writer.next_pass_seq - written_before
    bytes_per_pass = (rec.writer._writer.size - size_before) / max(written, 1)
    rows.append(("loaded pass, written", per_call_ns(original, *loaded, n), base_ns, rec_ns))
    rec.close()

    print(f"{'case':24} {'bare ns':>9} {'baseline ns':>12} {'recorder ns':>12} {'extra ns':>9} {'ratio':>7}")
    for name, bare, base, recd in rows:
        print(f"{name:24} {bare:9.0f} {base:12.0f} {recd:12.0f} {recd - base:9.0f} {recd / base:7.2f}")
    print(f"trace bytes per written loaded pass (32 waiting, 12 running): {bytes_per_pass:.0f}  ({written} passes)")
    with TraceReader(rec.writer.paths[0]) as reader:
        print(f"trace file: {reader.file_size} bytes, {reader.pass_count} pass records, "
              f"footer idle_passes={reader.footer.counts.get('idle_passes')}, lost={reader.footer.counts.get('lost')}")


if __name__ == "__main__":
    main()
