"""Recorder cost on hybrid passes, against a pass-through hook, same run.

``bench_recorder``'s method (the same three arms, the same rig state, the
same medians and paired differences) on the real pools sglang builds for
the two hybrid families. ``HybridPools`` is the rig's ``RealPools`` pass on
them, at bench sizes:

* mamba (Kimi-Linear's shape: linear attention plus full attention): a
  ``HybridReqToTokenPool`` with its ``MambaPool`` and ``MambaSlotAllocator``,
  a ``HybridLinearKVPool`` under a ``TokenToKVPoolAllocator``, and a
  ``UnifiedRadixCache`` with the FULL and MAMBA components; the server's
  ``no_buffer`` strategy, no overlap (the sandbox's flags);
* SWA (gpt-oss's shape): an ``SWAKVPool`` under a
  ``SWATokenToKVPoolAllocator`` and a ``UnifiedRadixCache`` with FULL and
  SWA, ``is_hybrid_swa`` on the scheduler (the SWA budget, the latch reset).

One full-attention layer and one mamba or sliding-window layer, one head of
eight: the pass moves indices, never KV data. The mamba state pool has
``MAMBA_SLOTS`` slots (sglang's CPU default would take 6.5 GB). Every cached
sequence holds its own state slot on a mamba tree, as a finished or stashed
request leaves one; a running request holds one more.

Cases, per family: the idle pass (nothing waiting; the target: +0.5 us at
most), and the admitting pass (admits 8, 4 on a cached prompt; the real
``init_new`` and ``prepare_for_extend`` bind request rows, state slots and
KV; the target: 1.05 at most). Each family has its own recorder, attached
to its scheduler as the plugin attaches it, so the trace's header and every
KV read are that family's. Then the cost of the one read that differs from
a full-pool pass: the recorder's ``PoolReaders.counts`` on these pools against the full-pool
read (two calls) on the same ones. Prints the pool counts the recorder wrote.
Torch runs on one thread. Run: ``python -m bench.bench_hybrid``. Nothing
here asserts a time.
"""

from __future__ import annotations

import tempfile
import time
from array import array
from types import SimpleNamespace
from typing import Any

import msgspec

from bench import bench_recorder as bench
from schedtrace.replay.driver import PassDriver
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Alloc, Header, Pass, PoolLayout, ServerArgs
from schedtrace.tracer.recorder import pools
from schedtrace.testing import rig
from schedtrace.tracer.recorder.header import header_row

FAMILIES = ("mamba", "swa")
MAMBA_SLOTS = 64  # a few dozen: 12 running, 27 cached sequences, the pass's admissions
KV_SIZE = 100_000  # full-pool tokens: the rig's state and the pass's 8192 with room to spare
SWA_SIZE = 80_000  # the SWA side: 0.8 of the full pool, gpt-oss's ratio in the sandbox
SLIDING_WINDOW = 128


def server_args() -> ServerArgs:
    return msgspec.structs.replace(rig.server_args(), max_total_tokens=KV_SIZE)


def hybrid_header(family: str) -> Header:
    """What ``PassDriver`` builds the scheduler shell from (the recorder writes its own header)."""
    args = server_args()
    size = args.max_total_tokens
    layout = (PoolLayout("TokenToKVPoolAllocator", "UnifiedRadixCache", size, mamba_size=MAMBA_SLOTS,
                         mamba_slots_per_req=1)
              if family == "mamba" else
              PoolLayout("SWATokenToKVPoolAllocator", "UnifiedRadixCache", size, swa_size=SWA_SIZE,
                         sliding_window=SLIDING_WINDOW))
    return builders.header(is_hybrid_mamba=family == "mamba", is_hybrid_swa=family == "swa", pools=layout,
                           server_args=args, max_req_slots=rig.header().max_req_slots)


class HybridPools(rig.RealPools):
    """``RealPools``' state (three cached prompts, finished requests in the
    tree, 12 running on the first prompt, 32 waiting, every other one on a
    prompt) on a hybrid model's real pools, put back before each pass."""

    def __init__(self, family: str, driver: Any) -> None:
        from sglang.srt.managers.schedule_policy import SchedulePolicy

        args = server_args()
        self.family = family
        with driver._config.installed():
            self.req_to_token_pool, self.allocator, self.tree_cache = rig.hybrid_pools(
                family, kv_size=args.max_total_tokens, slots=rig.header().max_req_slots, swa_size=SWA_SIZE,
                window=SLIDING_WINDOW, mamba_slots=MAMBA_SLOTS)
        self.mamba_allocator = getattr(self.req_to_token_pool, "mamba_allocator", None)
        self.policy = SchedulePolicy(
            args.schedule_policy, self.tree_cache, enable_hierarchical_cache=False,
            enable_priority_scheduling=False, schedule_low_priority_values_first=False,
        )
        self.prompts = [rig._tokens(100 + k, n) for k, n in enumerate(rig.SYSTEM_PROMPT_LENS)]
        self.record = rig.loaded_pass(batch_full=False)

    def attach(self, s: Any) -> None:
        """Put the pools and what the pass reads of them on ``s``, the scheduler
        shell of this family's own driver (nothing to put back)."""
        args = msgspec.structs.asdict(server_args())
        for name, value in self.scheduler_attributes(s).items():
            setattr(s, name, value)
        s.is_hybrid_swa = self.family == "swa"
        # PoolLayout and the mamba admission read the strategy; the sandbox runs no_buffer.
        s.server_args = SimpleNamespace(**args, mamba_radix_cache_strategy="no_buffer")

    def _state_slot(self) -> Any:
        """A mamba state slot for a cached sequence or a running request (None on SWA)."""
        return None if self.mamba_allocator is None else self.mamba_allocator.alloc(1)

    def _cache(self, tokens: array) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        kv = self.allocator.alloc(len(tokens))
        result = self.tree_cache.insert(InsertParams(key=RadixKey(tokens), value=kv, mamba_value=self._state_slot()))
        self.allocator.free(kv[: result.prefix_len])
        return result.last_device_node

    def _running(self) -> list:
        running = super()._running()
        if self.mamba_allocator is not None:
            for req in running:
                req.kv.mamba_pool_idx = self._state_slot()[0]
        return running

    def reset(self, s: Any) -> Any:
        """``RealPools.reset`` with the frees of a reset in one free group, as
        sglang groups them: one ``torch.cat`` on the free list, not one per insert."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.allocator.clear()
        self.req_to_token_pool.clear()
        if self.mamba_allocator is not None:
            self.mamba_allocator.clear()  # HybridReqToTokenPool.clear() leaves the state slots
        self.tree_cache.reset()
        self.allocator.free_group_begin()
        for prompt in self.prompts:
            self._cache(prompt)
        for f in range(rig.FINISHED_IN_CACHE):
            self._cache(rig._tokens(20_000 + f, rig.FINISHED_LEN))
        running = self._running()
        self.allocator.free_group_end()
        rig.set_pass_inputs(s, self._waiting(), None, self.record)
        return ScheduleBatch(reqs=running, batch_is_full=False)


# --- the run ---------------------------------------------------------------------

READS = 20_000  # count reads per timed loop


def family_rows(family: str, out: str) -> tuple[list, bench.TraceStats, list[str], list]:
    """The idle and admitting cases on ``family``'s pools: (rows, trace stats, trace paths, admitted)."""
    driver = PassDriver(hybrid_header(family))
    rig.prepare_scheduler(driver)
    hybrid = HybridPools(family, driver)
    s = driver.scheduler
    hybrid.attach(s)
    rec, trace = bench.started_recorder(out, f"bench-{family}", lambda p, f: header_row(s, 0, 0, p, f))
    rec.attach(s)
    points = rig.HookPoints()
    arms = bench.recorder_arms(points, rec)
    with driver._config.installed():
        batch = hybrid.reset(s)
        s.waiting_queue = []
        rows = [(f"{family}: idle pass", bench.looped(points, arms, s, batch, bench.IDLE_CALLS))]
        times, admitted = trace.written(f"{family}: admitting", lambda: bench.interleaved_medians(
            points, arms, lambda: (s, hybrid.reset(s)), bench.ADMITTING_CALLS, trace.drain))
        rows.append((f"{family}: admitting", times))
        rows.append(read_rows(family, s, hybrid))
    rec.close()
    return rows, trace, rec.writer.paths, admitted


def read_rows(family: str, s: Any, hybrid: HybridPools) -> tuple[str, dict[str, float]]:
    """The recorder's pass-entry read (``PoolReaders.counts``) against the full-pool read of the same pools."""
    hybrid.reset(s)
    readers = pools.PoolReaders(s)
    available, evictable = s.token_to_kv_pool_allocator.available_size, readers.evictable

    def full_read() -> tuple:
        return (available(), evictable())

    times = {}
    for name, read in (("full-pool read", full_read), ("kv_counts", readers.counts)):
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(READS):
                read()
            best = min(best, (time.perf_counter_ns() - start) / READS)
        times[name] = best
    return f"{family}: counts read", times


def print_trace_summary(family: str, paths: list[str]) -> None:
    """What the recorder wrote of the hybrid pools: the counts at the admitting pass's entry, the allocations."""
    records = []
    for path in paths:
        with TraceReader(path) as reader:
            layout = reader.header.pools
            records += [r for _, r in reader.records()]
    admitting = [r for r in records if isinstance(r, Pass) and r.admitted]
    ops = {}
    for a in records:
        if isinstance(a, Alloc):
            ops[a.op] = ops.get(a.op, 0) + 1
    print(f"{family} trace: header pools {layout.allocator} + {layout.tree_cache}, full {layout.full_size}, "
          f"swa {layout.swa_size}, mamba {layout.mamba_size}; {len(admitting)} admitting pass records, "
          f"allocs {dict(sorted(ops.items()))}")
    if admitting:
        print(f"  kv at entry: {admitting[0].kv}")


def main() -> None:
    import torch

    # One intra-op thread: the SWA allocator's index writes otherwise wait on the
    # other processes of a shared machine, and every arm pays that noise.
    torch.set_num_threads(1)
    out = tempfile.mkdtemp(prefix="schedtrace-bench-hybrid-")
    rows, traces, reads = [], [], []
    for family in FAMILIES:
        family_cases, trace, paths, admitted = family_rows(family, out)
        *cases, read = family_cases
        rows += cases
        reads.append(read)
        traces.append((family, trace, paths, admitted))
    print(f"{rig.WAITING} waiting, {rig.RUNNING} running; targets: idle +500 ns at most, admitting 1.050 at most")
    bench.print_table(rows, traces[0][1], width=18)
    for _, trace, _, _ in traces[1:]:
        for case, size in trace.bytes_per_pass.items():
            print(f"written pass, {case}: {size:.0f} trace bytes; writer thread {trace.writer_ns[case]:.0f} ns")
    for name, t in reads:
        print(f"{name}: kv_counts {t['kv_counts']:.0f} ns, full-pool read {t['full-pool read']:.0f} ns "
              f"({t['kv_counts'] / t['full-pool read']:.2f}x)")
    for family, _, paths, admitted in traces:
        hits = sum(1 for r in admitted if r.prefix_len > 0)
        print(f"{family}: the admitting pass admits {len(admitted)} ({hits} on a cached prefix)")
        print_trace_summary(family, paths)


if __name__ == "__main__":
    main()
