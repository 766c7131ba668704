"""The recorder plugin against real sglang: live server traces, crashes, failures."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import generate, random_input_ids

from schedtrace.tracer.contract.errors import SchedtraceError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.recorder.hooks import make_hooks
from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.contract.schema import Alloc, Arrival, Finish, HookError, Idle, KvSnapshot, Loss, Pass, WaitingReq
from schedtrace.tracer.recorder.writer_thread import WriterThread
from test_format import header

# --- live server --------------------------------------------------------------

SYSTEM_PROMPT = 2000  # tokens of the shared prompt in the shared-prompt test


def read_all(trace_dir: Path) -> tuple[list, int]:
    """Every record of every trace in trace_dir, and max_total_tokens."""
    records, max_total = [], 0
    for path in sorted(glob.glob(str(trace_dir / "*.trace"))):
        with TraceReader(path) as reader:
            max_total = reader.header.server_args.max_total_tokens or 0
            records.extend(r for _, r in reader.records())
    return records, max_total


def test_live_trace_matches_what_happened(sandbox) -> None:
    rids = [f"rec-live-{i}" for i in range(14)]
    lens = {rid: 1500 + 250 * i for i, rid in enumerate(rids)}
    with ThreadPoolExecutor(len(rids)) as pool:
        outs = list(pool.map(lambda rid: generate(sandbox, rid, lens[rid], 30), rids))
    assert all(o["meta_info"]["completion_tokens"] == 30 for o in outs)

    deadline = time.monotonic() + 30
    while True:  # the writer flushes every ~50 ms; the finish of the last one may lag
        records, max_total = read_all(sandbox.trace_dir)
        finished = {r.rid: r for r in records if isinstance(r, Finish)}
        if all(rid in finished for rid in rids) or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    arrivals = {r.rid: r for r in records if isinstance(r, Arrival)}
    for rid in rids:
        assert arrivals[rid].input_len == lens[rid]
        assert arrivals[rid].max_new_tokens == 30
        assert finished[rid].output_len == 30 and finished[rid].reason == "length"
        assert arrivals[rid].t_ns <= finished[rid].t_ns

    passes = [r for r in records if isinstance(r, Pass)]
    admitted = {a.rid for p in passes for a in p.admitted}
    assert set(rids) <= admitted
    # Every request is prefilled to its full length over its admissions.
    prefilled = {rid: 0 for rid in rids}
    for p in passes:
        for a in p.admitted:
            if a.rid in prefilled:
                prefilled[a.rid] = max(prefilled[a.rid], a.prefix_len + a.extend_len)
    assert prefilled == lens
    seqs = [p.seq for p in passes]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    for p in passes:
        assert 0 <= p.kv.available + p.kv.evictable <= max_total
        assert p.repeat >= 1
    allocs = [r for r in records if isinstance(r, Alloc)]
    assert allocs and all(a.ok for a in allocs)
    assert all(a.requested <= max_total for a in allocs)
    assert sum(r.count for r in records if isinstance(r, Idle)) > 0
    assert not [r for r in records if isinstance(r, (HookError, Loss))]


def test_live_shared_prompt_records_matches_and_lock_drops(sandbox) -> None:
    """A system prompt cached by one request and then shared by concurrent
    ones: each candidate's match, what pinning it took from the evictable
    count (all of it only while no other request held it), and a replay of
    the trace that reproduces every pass."""
    from schedtrace.replay.engine import replay_trace

    system = random_input_ids(SYSTEM_PROMPT, "rec-shared-system")
    generate(sandbox, "rec-shared-warm", SYSTEM_PROMPT + 8, 1, prefix_ids=system)  # leaves it cached, unpinned
    rids = [f"rec-shared-{i}" for i in range(10)]
    with ThreadPoolExecutor(len(rids)) as pool:
        outs = list(pool.map(
            lambda n: generate(sandbox, rids[n], SYSTEM_PROMPT + 300 + 400 * n, 20, prefix_ids=system),
            range(len(rids)),
        ))
    assert all(o["meta_info"]["cached_tokens"] >= SYSTEM_PROMPT for o in outs)

    records, _ = read_all(sandbox.trace_dir)
    candidates = [c for r in records if isinstance(r, Pass) for c in r.candidates if c.rid in rids]
    first_try = {}
    for c in candidates:
        first_try.setdefault(c.rid, c)
    assert set(first_try) == set(rids)
    assert all(c.prefix_len == SYSTEM_PROMPT for c in first_try.values())
    drops = [c.locked_evictable for c in candidates if c.prefix_len]
    # The first pin takes the whole (evictable) prompt; while a request holds it, a pin takes nothing.
    assert set(drops) <= {0, SYSTEM_PROMPT} and SYSTEM_PROMPT in drops and 0 in drops, drops
    for trace in sorted(Path(sandbox.trace_dir).glob("*.trace")):
        fid = replay_trace(trace, "stock", "stock").fidelity
        assert fid.matched == fid.total, [(m.pass_, m.fields) for m in fid.mismatches[:5]]


# --- writer under load, killed -----------------------------------------------

WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from tests.test_format import header
    from schedtrace.tracer.contract.schema import Arrival
    from schedtrace.tracer.recorder.writer_thread import WriterThread
    w = WriterThread(sys.argv[1], "killed", lambda part, first: header(),
                     clock_ns=time.monotonic_ns, flush_interval_s=0.002, queue_size=1 << 20)
    i = 0
    while True:
        w.submit(Arrival(i, f"r{i}", i, 1))
        i += 1
        if i == 20000:
            print("ready", flush=True)
        if i % 500 == 0:
            time.sleep(0.001)
    """
)


KILL_AFTER_RECORDS = 20_000  # the kill comes once the disk holds this many (the writer submits on)
WRITTEN_BOUND_S = 120  # a writer that never gets there fails the test: a hang guard, not a figure


def wait_for_records(path: Path, count: int) -> int:
    """Read the growing file until it holds ``count`` arrivals (or the bound passes); the count seen."""
    seen, deadline = 0, time.monotonic() + WRITTEN_BOUND_S
    while seen < count and time.monotonic() < deadline:
        try:
            with TraceReader(path, skip_damaged=True) as reader:  # a batch being written reads as a torn tail
                seen = sum(1 for _, r in reader.records() if isinstance(r, Arrival))
        except (FileNotFoundError, SchedtraceError):
            pass  # not created yet, or its header not yet written
        if seen < count:
            time.sleep(0.05)
    return seen


def test_kill9_keeps_every_written_record(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(tmp_path)],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout.readline().strip() == b"ready"
        on_disk = wait_for_records(tmp_path / "killed.part000.trace", KILL_AFTER_RECORDS)
        assert on_disk >= KILL_AFTER_RECORDS, f"only {on_disk} records reached the disk while the writer ran"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    (path,) = tmp_path.glob("killed.part000.trace")
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly
        rids = [r.rid for _, r in reader.records() if isinstance(r, Arrival)]
        end = reader.truncated_at
    assert len(rids) >= KILL_AFTER_RECORDS
    assert rids == [f"r{i}" for i in range(len(rids))]  # no gap, no reordering
    # Tear the last record as a crash mid-write would: the prefix still reads.
    data = path.read_bytes()[: (end or path.stat().st_size) - 3]
    path.write_bytes(data)
    with TraceReader(path) as reader:
        again = [r.rid for _, r in reader.records() if isinstance(r, Arrival)]
        assert reader.truncated_at is not None and reader.truncated_at < len(data)
    assert again == rids[: len(again)] and len(again) == len(rids) - 1


# --- queue full, rotation, folding (real writer thread) ------------------------


def test_full_queue_writes_exact_loss(tmp_path: Path) -> None:
    writer = WriterThread(tmp_path, "full", lambda part, first: header(),
                          clock_ns=time.monotonic_ns, queue_size=5, flush_interval_s=60)
    accepted = [writer.submit(Arrival(i, f"r{i}", 1, 1)) for i in range(12)]
    assert accepted == [True] * 5 + [False] * 7
    writer.close()
    with TraceReader(writer.paths[0]) as reader:
        records = [r for _, r in reader.records()]
        assert [r.rid for r in records if isinstance(r, Arrival)] == [f"r{i}" for i in range(5)]
        assert [r.count for r in records if isinstance(r, Loss)] == [7]
        assert reader.footer.counts["lost"] == 7


def sched_pass(rid: str = "a") -> Pass:
    return Pass(0, 0, 10, 1, 0, [WaitingReq(rid, 100, 0, 10, 0)], [], None, True,
                KvSnapshot(500, 0), 3, 0.5, 8192, [], [], None, None, True)


def test_rotation_keeps_pass_seq_consecutive(tmp_path: Path) -> None:
    writer = WriterThread(tmp_path, "rot", header_for, clock_ns=time.monotonic_ns,
                          max_bytes=2000, flush_interval_s=0.005)
    for i in range(200):
        writer.submit(sched_pass(f"r{i}"))
        if i % 20 == 0:
            time.sleep(0.01)
    writer.close()
    seqs = []
    assert len(writer.paths) > 1
    for part, path in enumerate(writer.paths):
        with TraceReader(path) as reader:
            assert reader.closed_cleanly
            assert reader.header.part == part and reader.header.first_pass == len(seqs)
            seqs.extend(p.seq for p in reader.passes())
    assert seqs == list(range(200))


def header_for(part: int, first: int):
    h = header()
    h.part, h.first_pass = part, first
    return h


def test_idle_and_fold(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval_s=0.005)
    rec.start(WriterThread(tmp_path, "fold", lambda p, f: header(), clock_ns=rec.now, flush_interval_s=0.005))
    emitter = rec.emitter
    emitter.idle = 3  # as the pass hook counts idle passes
    for _ in range(4):
        emitter.emit_pass(sched_pass(), True, ("same",))
    emitter.idle = 2
    emitter.emit_pass(sched_pass(), True, ("same",))  # idle in between: a new record
    rec.emit(Arrival(rec.now(), "b", 5, 5))
    rec.close()
    with TraceReader(rec.writer.paths[0]) as reader:
        records = [r for _, r in reader.records()][1:]
        assert [type(r).__name__ for r in records] == ["Idle", "Pass", "Idle", "Pass", "Arrival"]
        assert [(p.seq, p.repeat, p.idle_before) for p in records if isinstance(p, Pass)] == [(0, 4, 3), (1, 1, 2)]
        assert reader.footer.counts["idle_passes"] == 5


# --- a failing hook never reaches sglang -------------------------------------


def test_failing_hook_keeps_original_result(tmp_path: Path) -> None:
    import torch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    class BrokenScheduler:  # the recorder reads evictable tokens from it: that raises
        tree_cache = None

    rec = Recorder(tmp_path, flush_interval_s=0.005)
    rec.start(WriterThread(tmp_path, "hookerr", lambda p, f: header(), clock_ns=rec.now, flush_interval_s=0.005))
    rec.attach(BrokenScheduler())
    hooks = dict(make_hooks(rec))
    original = TokenToKVPoolAllocator.alloc
    wrapped = _wrap_fn(original, hooks["sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc"], HookType.AROUND)
    allocator = TokenToKVPoolAllocator(64, torch.float32, "cpu", None, need_sort=False)
    first = wrapped(allocator, 10)
    second = wrapped(allocator, 10)
    assert first.tolist() == list(range(1, 11)) and second.tolist() == list(range(11, 21))
    assert allocator.available_size() == 44
    assert wrapped(allocator, 100) is None  # the real refusal still comes back
    rec.close()
    assert rec.hook_errors == {"alloc": 3}
    with TraceReader(rec.writer.paths[0]) as reader:
        errors = [r for _, r in reader.records() if isinstance(r, HookError)]
        assert [(e.hook, e.count) for e in errors] == [("alloc", 1), ("alloc", 3)]
        assert "AttributeError" in errors[0].message
        assert reader.footer.counts["hook_errors"] == 3


# --- deferred build: the writer thread sees the pass as it entered ------------


def test_capture_keeps_entry_values_and_folds_by_identity(tmp_path: Path) -> None:
    from schedtrace.replay.driver import PassDriver
    from schedtrace.testing.rig import header as rig_header, load, loaded_pass

    driver = PassDriver(rig_header())
    rec = Recorder(tmp_path)
    rec.start(WriterThread(tmp_path, "deferred", lambda p, f: header(), clock_ns=rec.now, flush_interval_s=3600))
    with driver._config.installed():
        scheduler, batch = load(driver, loaded_pass(batch_full=True))
        first = rec.begin_pass(scheduler, batch)
        rec.end_pass(scheduler, first, (None, batch), None)
        second = rec.begin_pass(scheduler, batch)  # same requests, same ints: folds
        rec.end_pass(scheduler, second, (None, batch), None)
        running0, waiting0 = batch.reqs[0], scheduler.waiting_queue[0]
        running0.output_ids.append(7)  # a decode step: the next pass differs
        third = rec.begin_pass(scheduler, batch)
        rec.end_pass(scheduler, third, (None, batch), None)
        rec.flush()
        # Mutate after the passes, before the writer builds: the records keep entry values.
        running0.output_ids.extend([7] * 50)
        waiting0.prefix_len = 999
        scheduler.waiting_queue.reverse()
        rec.close()
    expected = loaded_pass(batch_full=True)
    with TraceReader(rec.writer.paths[0]) as reader:
        passes = list(reader.passes())
    assert [p.repeat for p in passes] == [2, 1]
    assert passes[0].waiting == expected.waiting and passes[0].running == expected.running
    assert passes[1].waiting == expected.waiting
    assert passes[1].running[0].output_len == expected.running[0].output_len + 1
    assert passes[1].running[1:] == expected.running[1:]
    assert passes[0].kv == passes[1].kv == expected.kv and passes[1].batch_is_full_in


# --- the lock probe: what pinning a candidate's prefix takes from evictable ----


def test_lock_probe_keeps_only_the_unpinned_part_of_a_real_radix_tree() -> None:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

    from schedtrace.tracer.recorder.lock_probe import LockProbe

    cache = RadixCache.create_simulated()
    running_ids = list(range(100))
    candidate_ids = list(range(60)) + list(range(1000, 1040))  # shares 60 tokens with the running one
    for ids in (running_ids, candidate_ids):
        cache.insert(InsertParams(key=RadixKey(token_ids=ids), value=torch.arange(len(ids))))
    running = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=running_ids)))
    candidate = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=candidate_ids)))
    assert candidate.device_prefix_len == 100
    cache.lock(running.last_device_node)  # the running request pins its 100 tokens
    assert cache.evictable_size() == 40

    probe = LockProbe()
    original = RadixCache.inc_lock_ref

    def lock(node):  # RadixCache.lock through HookRegistry's AROUND wrapper of inc_lock_ref
        return probe.hook(original, cache, node).to_dec_params()

    probe.armed = True
    pin = lock(candidate.last_device_node)
    assert not probe.armed  # the first pin disarms it: the commit's second pin is not measured
    kept = lock(candidate.last_device_node)
    assert probe.drop == 40 and probe.error is None  # not 100: 60 were already pinned
    assert cache.evictable_size() == 0
    probe.armed = True  # the next candidate: a pin on the same, now pinned, prefix drops nothing
    again = lock(candidate.last_device_node)
    assert probe.drop == 0
    unarmed = lock(candidate.last_device_node)  # unarmed: not measured
    assert probe.drop == 0
    for receipt in (again, unarmed, pin, kept):
        cache.dec_lock_ref(candidate.last_device_node, receipt)
    assert cache.evictable_size() == 40


@pytest.mark.parametrize(("recorded", "measured"), [(500, 500), (None, 700)])
def test_add_one_req_hook_records_the_lock_drop(tmp_path: Path, recorded, measured,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real pass and PrefillAdder (on replay's tree-cache stand-in,
    which applies a recorded drop or else pins the whole match): the hook
    records what the first lock on each candidate took from the evictable
    count, through the pass that replay stops right after admission (it raises)."""
    from test_replay import SHARED_PREFIX, pinned_prefix_trace

    from schedtrace.replay import driver as driver_module
    from schedtrace.replay.driver import PassDriver
    from schedtrace.tracer.recorder.targets import ADD_ONE_REQ_TARGET, PASS_TARGET

    # The recorder's pass hook reads the waiting queue at pass entry, before calc_priority, where
    # the driver leaves it unbuilt for its own arms: build it first, as for a user's arm.
    monkeypatch.setattr(driver_module, "reads_queue_early", lambda fixes: True)
    from schedtrace.tracer.recorder.lock_probe import LOCK_TARGETS
    from schedtrace.testing.rig import HookPoints

    with TraceReader(pinned_prefix_trace(tmp_path / "t.trace", recorded)) as reader:
        driver = PassDriver(reader.header)
        p = reader.pass_at(0)
    rec = Recorder(tmp_path)
    rec.start(WriterThread(tmp_path, "probe", lambda part, first: header(), clock_ns=rec.now, flush_interval_s=3600))
    # Replay's tree-cache stand-in has its own inc_lock_ref (with RadixCache's sign):
    # the probe's hook on it, as on the real trees' (LOCK_TARGETS).
    stand_in = "schedtrace.replay.state.RecordedTreeCache.inc_lock_ref"
    hooks = {**dict(make_hooks(rec)), stand_in: rec.lock_probe.hook}
    assert hooks[LOCK_TARGETS[0]] == rec.lock_probe.hook
    points = HookPoints((ADD_ONE_REQ_TARGET, PASS_TARGET, stand_in))
    with points.hooked(points.wrapped(hooks)):
        decision = driver.decide(p, "stock")
    rec.close()
    assert rec.hook_errors == {}
    with TraceReader(rec.writer.paths[0]) as reader:
        (recorded_pass,) = reader.passes()
    first, *rest = recorded_pass.candidates
    assert (first.rid, first.prefix_len, first.locked_evictable) == ("cached", SHARED_PREFIX, measured)
    # Admitted, ``cached`` leaves ``fresh`` a try; its empty match pins nothing.
    assert [(c.rid, c.locked_evictable) for c in rest] == ([("fresh", 0)] if recorded is not None else [])
    assert (decision.admitted == [("cached", 1)]) == (recorded is not None)
    assert [a.rid for a in recorded_pass.admitted] == [rid for rid, _ in decision.admitted]
