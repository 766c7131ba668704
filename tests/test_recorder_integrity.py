"""The recorder's integrity: file names that never collide, every loss counted, the disk
budget, ring mode, turning recording on and off, and a kill -9 of a live scheduler.

Real writer threads writing real files; the one failing disk is a ``FileOps``
(the system calls ``TraceWriter`` makes) that refuses bytes past a capacity,
and a real one is the kernel's file size limit in a child process.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from schedtrace.testing.builders import header, pass_record
from schedtrace.tracer.contract.format import FileOps, TraceReader, encode
from schedtrace.tracer.contract.names import (
    CONTROL_FILE_ENV,
    DIR_ENV,
    LOSS_PASS_TOO_LARGE,
    LOSS_PAUSED,
    LOSS_RING,
    SEEK_BYTES,
    LOSS_WRITE_ERROR,
)
from schedtrace.tracer.contract.schema import (Alloc, Arrival, Clock, Finish, KvSnapshot, Loss, Pass, RunningReq,
                                               WaitingReq)
from schedtrace.tracer.contract.traceset import open_traceset
from schedtrace.tracer.recorder.lifecycle import RESUMING, Recorder, State
from schedtrace.tracer.recorder.naming import part_name, trace_stem
from schedtrace.tracer.recorder.policy import WriterPolicy
from schedtrace.tracer.recorder.ranks import ranks_of
from schedtrace.tracer.recorder.triggers import ALLOC_FAILED
from schedtrace.tracer.recorder.writer_thread import WriterThread

REPO = Path(__file__).resolve().parents[1]
MANUAL = 3600.0  # flush interval of a writer the test drains itself


def header_for(part: int, first: int):
    return header(part=part, first_pass=first)


def manual_writer(directory: Path, stem: str, **kwargs) -> WriterThread:
    return WriterThread(directory, stem, header_for, clock_ns=time.monotonic_ns, flush_interval_s=MANUAL, **kwargs)


def records_of(path: Path) -> list:
    with TraceReader(path) as reader:
        assert reader.gaps == [], reader.gaps
        return [r for _, r in reader.records()][1:]


def rids(records: list) -> list[str]:
    return [r.rid for r in records if isinstance(r, Arrival)]


def schedtrace_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("schedtrace") and r.levelno >= logging.WARNING]


def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


# --- file names ------------------------------------------------------------------


def test_two_writers_with_one_name_and_a_crashed_trace_all_stay_whole(tmp_path: Path) -> None:
    """A restarted container that reuses its pid and run id, and a second server in the same
    directory under that id: nobody overwrites anybody, and both traces read back whole."""
    stem = trace_stem("run-1", ranks_of(), 4242, host="node")
    assert stem == "schedtrace-run-1-node-tp0-dp0-pp0-pid4242"
    crashed = tmp_path / part_name(stem, 0)
    crashed.write_bytes(b"what the crashed run left")
    first, second = (manual_writer(tmp_path, stem, max_bytes=3000) for _ in range(2))
    for i in range(400):
        first.submit(Arrival(i, f"a{i}", 10, 5))
        second.submit(Arrival(i, f"b{i}", 10, 5))
        if i % 40 == 39:
            first.drain()
            second.drain()
    first.close()
    second.close()
    assert crashed.read_bytes() == b"what the crashed run left"
    assert len(first.paths) > 1 and len(second.paths) > 1  # both rotated, still apart
    assert not set(first.paths) & set(second.paths)
    assert set(tmp_path.iterdir()) == {crashed, *first.paths, *second.paths}
    for writer, prefix in ((first, "a"), (second, "b")):
        got = [rid for path in writer.paths for rid in rids(records_of(path))]
        assert got == [f"{prefix}{i}" for i in range(400)]
        for part, path in enumerate(writer.paths):
            assert path.name.endswith(f".part{part:03d}.trace") and ".dup" in path.name
            with TraceReader(path) as reader:
                assert reader.closed_cleanly and reader.header.part == part


# --- write failures ------------------------------------------------------------------


class FillingDisk(FileOps):
    """A disk with ``capacity`` bytes: the write that crosses it lands partway, later ones fail."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.refused = 0

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        room = self.capacity - offset
        if room <= 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.pwrite(fd, data[:room], offset)


def test_a_full_disk_loses_records_counted_once_and_logged_once(tmp_path: Path, caplog) -> None:
    disk = FillingDisk(capacity=1 << 40)
    writer = manual_writer(tmp_path, "full", policy=WriterPolicy(file_ops=disk))
    sent: list[str] = []

    def send(n: int) -> None:
        for _ in range(n):
            rid = f"r{len(sent)}"
            sent.append(rid)
            writer.submit(Arrival(len(sent), rid, 10, 5))
        writer.drain()

    with caplog.at_level(logging.WARNING):
        send(300)
        disk.capacity = writer.paths[0].stat().st_size + 5000  # the next writes run out of room partway
        for _ in range(132):
            send(30)
        disk.capacity = 1 << 40  # space freed
        send(300)
        writer.close()
    assert disk.refused > 100
    records = records_of(writer.paths[0])
    on_disk = rids(records)
    lost = [rid for rid in sent if rid not in set(on_disk)]
    assert on_disk == [rid for rid in sent if rid not in set(lost)]  # in order, nothing twice
    assert on_disk[:300] == sent[:300] and on_disk[-300:] == sent[-300:]
    assert 0 < len(lost) < 132 * 30
    losses = [r for r in records if isinstance(r, Loss)]  # each counts the records lost since the one before
    assert {r.reason for r in losses} == {LOSS_WRITE_ERROR} and sum(r.count for r in losses) == len(lost)
    with TraceReader(writer.paths[0]) as reader:
        counts = reader.footer.counts
    assert counts["write_errors"] == len(lost) and counts["lost"] == len(lost)
    assert counts["arrive"] == len(on_disk) and counts["loss"] == len(losses)
    warnings = schedtrace_warnings(caplog)
    assert len(warnings) == 1 and "No space left on device" in warnings[0], warnings


FSIZE_SCRIPT = textwrap.dedent(
    """
    import json, logging, resource, signal, sys, time
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s|%(message)s")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    from schedtrace.testing.builders import header
    from schedtrace.tracer.contract.schema import Arrival
    from schedtrace.tracer.recorder.writer_thread import WriterThread
    w = WriterThread(sys.argv[1], "fsize", lambda part, first: header(), clock_ns=time.monotonic_ns,
                     flush_interval_s=3600)
    for i in range(20000):
        w.submit(Arrival(i, f"r{i}", 10, 5))
        if i % 100 == 99:
            w.drain()
    w.close()
    print(json.dumps({"path": str(w.paths[0]), "write_errors": w.write_errors}))
    """
)


def test_the_kernel_refusing_writes_leaves_a_readable_prefix_and_one_log_line(tmp_path: Path) -> None:
    limit = 40_000
    done = subprocess.run([sys.executable, "-c", FSIZE_SCRIPT, str(tmp_path), str(limit)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    path = Path(out["path"])
    assert path.stat().st_size <= limit
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly  # the footer did not fit either
        assert reader.gaps == [] and reader.truncated_at is None  # cut back to the last whole batch
        on_disk = [r.rid for _, r in reader.records() if isinstance(r, Arrival)]
    assert on_disk == [f"r{i}" for i in range(len(on_disk))] and on_disk
    assert out["write_errors"] == 20000 - len(on_disk)
    lines = [line for line in done.stderr.splitlines() if line.startswith("schedtrace")]
    assert len(lines) == 1 and "File too large" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


# --- durability and the shared timeline -----------------------------------------------


class CountingDisk(FileOps):
    def __init__(self) -> None:
        self.syncs = 0

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        super().fsync(fd)


@pytest.mark.parametrize("every", [None, 0.0])
def test_parts_are_synced_as_the_policy_says(tmp_path: Path, every: float | None) -> None:
    disk = CountingDisk()
    writer = manual_writer(tmp_path, "sync", max_bytes=3000, policy=WriterPolicy(fsync_every_s=every, file_ops=disk))
    writes = 0
    for i in range(200):
        writer.submit(Arrival(i, f"r{i}", 10, 5))
        if i % 20 == 19:
            writer.drain()
            writes += 1
    writer.close()
    parts = len(writer.paths)
    assert parts > 1
    if every is None:  # only at rotation and close: after the footer, and after the tail
        assert disk.syncs == 2 * parts
    else:  # after every write as well
        assert disk.syncs >= writes + 2 * parts


def test_the_environment_sets_the_policy() -> None:
    from schedtrace.tracer.contract.names import (
        CLOCK_S_ENV, FSYNC_MS_ENV, MAX_TOTAL_BYTES_ENV, MODE_ENV, RING_BYTES_ENV,
    )

    assert WriterPolicy.from_env({}) == WriterPolicy()
    policy = WriterPolicy.from_env({FSYNC_MS_ENV: "250", CLOCK_S_ENV: "3", MAX_TOTAL_BYTES_ENV: "1000000",
                                    MODE_ENV: "Ring", RING_BYTES_ENV: "4096", CONTROL_FILE_ENV: "/run/ctl"})
    assert policy == WriterPolicy(fsync_every_s=0.25, clock_every_s=3, max_total_bytes=1_000_000,
                                  ring_bytes=4096, control_file="/run/ctl")
    assert WriterPolicy.from_env({FSYNC_MS_ENV: "0"}).fsync_every_s is None
    assert not WriterPolicy.from_env({MODE_ENV: "tape"}).ring  # an unknown mode writes files (logged)


def test_clock_records_pair_wall_and_monotonic_time(tmp_path: Path) -> None:
    writer = manual_writer(tmp_path, "clock", policy=WriterPolicy(clock_every_s=0.0))
    for i in range(3):
        writer.submit(Arrival(i, f"r{i}", 10, 5))
        writer.drain()
    writer.close()
    clocks = [r for r in records_of(writer.paths[0]) if isinstance(r, Clock)]
    assert len(clocks) == 4  # each drain, and the last one at close
    assert [c.t_ns for c in clocks] == sorted(c.t_ns for c in clocks)
    assert [c.wall_ns for c in clocks] == sorted(c.wall_ns for c in clocks)


# --- disk budget ------------------------------------------------------------------


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir())


def a_pass(rid: str) -> Pass:
    return pass_record(0, waiting=[WaitingReq(rid, 100, 0, 10, 0)], kv=KvSnapshot(available=0, evictable=0))


def test_the_disk_budget_deletes_the_oldest_parts_and_says_so(tmp_path: Path, caplog) -> None:
    cap = 40_000
    writer = manual_writer(tmp_path, "budget", policy=WriterPolicy(max_total_bytes=cap))
    passes = 0
    with caplog.at_level(logging.WARNING):
        for _ in range(80):
            for _ in range(20):
                writer.submit(a_pass(f"r{passes}"))
                passes += 1
            writer.drain()
            assert dir_bytes(tmp_path) <= cap
        writer.close()
    assert dir_bytes(tmp_path) <= cap
    kept = [p for p in writer.paths if p.exists()]
    assert kept == writer.paths[-len(kept):] and len(kept) < len(writer.paths)  # the oldest went
    with TraceReader(kept[-1]) as reader:
        counts = reader.footer.counts
    assert counts["deleted_parts"] == len(writer.paths) - len(kept)
    assert counts["deleted_bytes"] > 0
    with open_traceset([tmp_path]) as traces:
        (rank,) = traces.runs[0].ranks
        seqs = [p.seq for p in rank.passes()]
        assert any("the parts before it are not in the set" in note for note in traces.notes)
    assert seqs == list(range(seqs[0], passes)) and seqs[0] > 0  # the newest passes, consecutive
    warnings = schedtrace_warnings(caplog)
    assert len(warnings) == 1 and "disk budget" in warnings[0]


# --- ring mode ------------------------------------------------------------------


def test_a_failed_allocation_writes_the_window_before_it_then_the_ring_fills_again(tmp_path: Path) -> None:
    ring_bytes = 4000
    writer = manual_writer(tmp_path, "ring", policy=WriterPolicy(ring_bytes=ring_bytes))
    before: list = []
    for i in range(500):
        before.append(Arrival(i, f"r{i}", 10, 5))
        if i % 10 == 9:
            before.append(a_pass(f"p{i}"))  # the head does not fit: back-pressure, not a stall
        if i % 50 == 49:
            for record in before[-55:]:
                writer.submit(record)
            writer.drain()
    assert writer.paths == [] and not list(tmp_path.iterdir())  # nothing on disk before a trigger
    refused = Alloc(500, -1, "alloc", 100, 5, 0, False)
    writer.submit(refused)
    writer.drain()
    (path,) = writer.paths
    after = [Arrival(600 + i, f"after{i}", 10, 5) for i in range(400)]
    for i, record in enumerate(after):  # recording goes on into the part, for another ring's worth
        writer.submit(record)
        if i % 20 == 19:
            writer.drain()
    assert len(writer.paths) == 1 and writer.part == 1  # that part is closed; the ring fills again
    writer.submit(Arrival(2000, "late", 10, 5))
    writer.triggers.request()  # as SIGUSR2 does
    writer.drain()
    writer.close()

    first = records_of(path)
    loss, window = first[0], first[1:]
    assert isinstance(loss, Loss) and loss.reason == LOSS_RING
    cut = next(i for i, r in enumerate(window) if isinstance(r, Alloc))
    assert window[cut] == refused
    assert [key(r) for r in window[:cut]] == [key(r) for r in before[loss.count:]]  # every record up to it
    held = sum(len(encode(r)) for r in window[:cut])
    # the window is full: the record that fell off last would not have fitted beside it
    assert ring_bytes - len(encode(before[loss.count - 1])) < held <= ring_bytes
    tail = rids(window[cut + 1:])
    assert tail == [r.rid for r in after[: len(tail)]] and 0 < len(tail) < len(after)
    second = records_of(writer.paths[1])
    assert isinstance(second[0], Loss) and second[0].reason == LOSS_RING
    assert rids(second)[-1] == "late"
    assert second[0].count + len(rids(second)) == len(after) - len(tail) + 1  # nothing unaccounted
    with open_traceset([tmp_path]) as traces:  # the windows read as one trace with gaps
        (rank,) = traces.runs[0].ranks
        seqs = [p.seq for p in rank.passes()]
    assert seqs == list(range(len(seqs))) and seqs


def key(record) -> str:
    return record.rid if isinstance(record, Arrival) else record.waiting[0].rid


def overload_pass(n: int) -> Pass:
    """A pass under a long queue that moves on by one request a pass, with a decoding batch: deltas pay."""
    waiting = [WaitingReq(f"{i:032x}", 500 + i % 7, 0, 64, 0) for i in range(n, n + 40)]
    running = [RunningReq(f"{i:032x}", 300, n - i, 64) for i in range(n - 8, n)]
    return pass_record(n, t_ns=n * 1000, waiting=waiting, running=running, req_slots_free=0,
                       kv=KvSnapshot(available=1000 - n, evictable=n))


def unnumbered(records: list) -> list:
    return [msgspec.structs.replace(r, seq=0) if isinstance(r, Pass) else r for r in records]


def test_the_ring_keeps_v2_and_a_window_decodes_to_the_records_it_kept(tmp_path: Path) -> None:
    ring_bytes = 32 << 10
    writer = manual_writer(tmp_path, "v2ring", policy=WriterPolicy(ring_bytes=ring_bytes))
    submitted: list = []
    for n in range(8, 608):
        submitted += [overload_pass(n), Arrival(n * 1000 + 1, f"{n + 40:032x}", 500, 64)]
        writer.submit(msgspec.structs.replace(submitted[-2]))  # a copy: the ring numbers what it is given
        writer.submit(submitted[-1])
        if n % 10 == 0:
            writer.drain()
    writer.drain()
    ring = writer.ring
    assert ring.capacity // 2 < ring.size <= ring.capacity  # the old end drops a segment (a keyframe's run) at a time
    writer.triggers.request()
    writer.drain()
    writer.close()
    (path,) = writer.paths
    loss, *window = records_of(path)
    assert isinstance(loss, Loss) and loss.reason == LOSS_RING and loss.count > 0
    assert unnumbered(window) == unnumbered(submitted[loss.count:])  # every record kept, passes rebuilt exactly
    assert sum(len(encode(r)) for r in window) > 4 * ring_bytes  # v1 records: a v1 ring held a quarter of it


@pytest.mark.parametrize("mode", ["file", "ring"])
def test_a_pass_too_large_for_any_file_is_a_counted_loss_and_the_passes_after_it_number_on(
        tmp_path: Path, mode: str, capsys: pytest.CaptureFixture) -> None:
    """A queue of some 20,000 requests makes one pass past SEEK_BYTES whole: the file holds a Loss in its place
    (with its Alloc), the footer counts it, and the passes after it carry on the numbering, in either mode."""
    policy = WriterPolicy(ring_bytes=8 << 20) if mode == "ring" else WriterPolicy()
    writer = manual_writer(tmp_path, mode, policy=policy)
    huge = pass_record(0, waiting=[WaitingReq(f"{i:032x}", 100, 0, 10, 0) for i in range(SEEK_BYTES // 30)],
                       kv=KvSnapshot(available=0, evictable=0))
    for record in [a_pass("before"), huge, Alloc(5, -1, "alloc", 10, 5, 0, True), Arrival(6, "a", 10, 5),
                   a_pass("after"), Alloc(7, -1, "alloc", 10, 5, 0, mode != "ring")]:  # ring: a failure triggers
        writer.submit(record)
    writer.drain()
    writer.close()
    (path,) = writer.paths
    records = records_of(path)  # ring: the window, nothing fell off its old end
    assert [type(r).__name__ for r in records] == ["Pass", "Loss", "Arrival", "Pass", "Alloc"]
    assert (records[1].reason, records[1].count) == (LOSS_PASS_TOO_LARGE, 2)
    assert [r.seq for r in records if isinstance(r, Pass)] == [0, 1]
    assert records[3].waiting[0].rid == "after" and records[4].pass_seq == 1
    with TraceReader(path) as reader:
        assert reader.footer.counts["lost"] == 2
    from schedtrace.cli import run

    assert run(["info", str(path)]) == 0
    assert "2 records lost after pass 0 (pass_too_large: a pass too large to write" in capsys.readouterr().out


def stalled_pass(n: int, error: str | None = None) -> Pass:
    """Requests wait and the head fits a free slot, yet nothing is admitted: a stall by the rule."""
    return pass_record(n, t_ns=n, waiting=[WaitingReq("head", 100, 0, 10, 0)],
                       kv=KvSnapshot(available=30_000, evictable=0), req_slots_free=4, error=error)


def test_a_stall_by_the_stall_rule_triggers_once_it_is_long_enough(tmp_path: Path) -> None:
    writer = manual_writer(tmp_path, "stall", policy=WriterPolicy(ring_bytes=1 << 20))
    min_passes = writer.triggers.min_passes
    for n in range(min_passes - 1):
        writer.submit(stalled_pass(n))
        writer.drain()
    assert writer.paths == []
    writer.submit(stalled_pass(min_passes - 1))
    writer.drain()
    writer.close()
    (path,) = writer.paths
    passes = [r for r in records_of(path) if isinstance(r, Pass)]
    assert [p.t_ns for p in passes] == list(range(min_passes))  # the whole run, up to the trigger
    assert [p.seq for p in passes] == list(range(min_passes))  # numbered as written


@pytest.mark.parametrize("trigger", ["alloc", "error"])
def test_each_trigger_kind_fires(tmp_path: Path, trigger: str) -> None:
    writer = manual_writer(tmp_path, trigger, policy=WriterPolicy(ring_bytes=1 << 20))
    writer.submit(Arrival(0, "a", 10, 5))
    writer.drain()
    assert writer.triggers.check([stalled_pass(0)]) is None  # one stalled pass is not a stall
    fired = [Alloc(1, -1, "alloc", 10, 5, 0, False)] if trigger == "alloc" else [stalled_pass(1, "RuntimeError: x")]
    assert writer.triggers.check(fired) == (ALLOC_FAILED if trigger == "alloc" else "pass_error")
    writer.submit(fired[0])
    writer.drain()
    writer.close()
    assert len(writer.paths) == 1 and rids(records_of(writer.paths[0])) == ["a"]


def pooled_scheduler() -> SimpleNamespace:
    """The scheduler attributes the header reads, over real (tiny) sglang pools."""
    from schedtrace.testing.rig import RealPools, server_args

    pools = RealPools(server_args(), 4)
    return SimpleNamespace(server_args=SimpleNamespace(), token_to_kv_pool_allocator=pools.allocator,
                           tree_cache=pools.tree_cache, req_to_token_pool=pools.req_to_token_pool)


def test_sigusr2_writes_the_ring_out(tmp_path: Path) -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    rec = Recorder(tmp_path, flush_interval_s=0.01, policy=WriterPolicy(ring_bytes=1 << 20))
    try:
        rec.attach(pooled_scheduler())
        rec.close_at_exit()  # the main thread, as in the scheduler process
        for i in range(5):
            rec.emit(Arrival(rec.now(), f"s{i}", 10, 5))
        wait_for(lambda: rec.writer is not None and rec.writer.ring.kept == 5, "the ring to hold the records")
        assert not list(tmp_path.iterdir())
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for(lambda: rec.writer.paths, "the window to be written")
        rec.close()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert rids(records_of(rec.writer.paths[0])) == [f"s{i}" for i in range(5)]


# --- on and off without a restart ------------------------------------------------------


def test_the_control_file_turns_recording_off_and_on(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.write_text("on\n")
    rec = Recorder(tmp_path / "traces", flush_interval_s=0.01, policy=WriterPolicy(control_file=str(control)))
    rec.attach(pooled_scheduler())  # with a control file the writer starts with the scheduler
    assert rec.state is State.RECORDING and rec.paused is False
    for i in range(10):
        rec.emit(Arrival(rec.now(), f"a{i}", 10, 5))
    control.write_text("OFF")
    wait_for(lambda: rec.paused is True, "the writer to read 'off'")
    for i in range(5):
        rec.emit(Arrival(rec.now(), f"off{i}", 10, 5))
    assert rec.begin_pass(None, None) is None  # a pass runs unrecorded, counted
    assert rec.skipped == 6
    control.write_text("on")
    wait_for(lambda: rec.paused is RESUMING, "the writer to read 'on'")
    for i in range(10):
        rec.emit(Arrival(rec.now(), f"b{i}", 10, 5))
    assert rec.paused is False
    rec.close()
    records = records_of(rec.writer.paths[0])
    assert rids(records) == [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
    (loss,) = [r for r in records if isinstance(r, Loss)]
    assert (loss.reason, loss.count) == (LOSS_PAUSED, 6)
    assert records.index(loss) == 10  # exactly where the gap is
    with TraceReader(rec.writer.paths[0]) as reader:
        assert reader.footer.counts["lost"] == 6


def test_off_from_the_start_records_nothing_until_on(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.write_text("off")
    rec = Recorder(tmp_path / "traces", flush_interval_s=0.01, policy=WriterPolicy(control_file=str(control)))
    rec.attach(pooled_scheduler())
    assert rec.paused is True  # read once before the first pass
    rec.emit(Arrival(rec.now(), "early", 10, 5))
    rec.close()
    records = records_of(rec.writer.paths[0])
    assert rids(records) == [] and [(r.reason, r.count) for r in records if isinstance(r, Loss)] == [(LOSS_PAUSED, 1)]


# --- an unusable directory ------------------------------------------------------


PLUGIN_LOAD = textwrap.dedent(
    """
    import json, logging, os, subprocess, sys
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s|%(message)s")
    from sglang.srt.plugins import load_plugins
    load_plugins()  # sglang's own plugin loading, as the launcher does it
    from schedtrace.tracer import plugin
    print(json.dumps({"recorder": plugin._recorder is not None, "dir": os.environ.get(sys.argv[1])}), flush=True)
    if len(sys.argv) > 2:  # a process started from here inherits the environment, as sglang's ranks do
        subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]])
    """
)


def test_an_unusable_directory_is_reported_once_at_plugin_load(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_PLUGINS", CONTROL_FILE_ENV)}
    env[DIR_ENV] = "/proc/x"
    done = subprocess.run([sys.executable, "-c", PLUGIN_LOAD, DIR_ENV, PLUGIN_LOAD], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    launcher, child = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert launcher == {"recorder": False, "dir": None} and child == {"recorder": False, "dir": None}
    lines = [line for line in done.stderr.splitlines() if line.startswith("schedtrace")]
    assert len(lines) == 1 and "/proc/x" in lines[0] and "recording is off" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_directory_lost_before_the_first_record_is_one_line_and_off(tmp_path: Path, caplog) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    rec = Recorder(blocked / "traces")
    rec.attach(pooled_scheduler())
    with caplog.at_level(logging.WARNING):
        rec.emit(Arrival(0, "a", 10, 5))
        rec.emit(Arrival(1, "b", 10, 5))
    assert rec.state is State.OFF and rec.writer is None
    (record,) = [r for r in caplog.records if r.name.startswith("schedtrace")]
    assert record.exc_info is None and "recording is off" in record.getMessage()


# --- kill -9 of a live scheduler -------------------------------------------------------


@pytest.mark.stops_shared_server
def test_kill9_mid_load_keeps_everything_written(armed_sandbox) -> None:
    """A kill -9 of the scheduler under load (the shared ``armed_sandbox``, as its last test). What the
    writer wrote reads back, and what it held in memory is bounded as the README says: the queue
    (``SCHEDTRACE_QUEUE``, small here) and the batch it had taken from it but not written, beside the
    losses the trace itself records."""
    from conftest import WRITER_QUEUE, generate

    server = armed_sandbox.server
    trace_dir = server.trace_dir
    first = [f"k9-a{i}" for i in range(6)]
    for rid in first:
        generate(server, rid, 300, 4)
    wait_for(lambda: first_settled(live_records(trace_dir), first),
             "the first requests' finishes on disk, or their loss counted (no close needed)", timeout_s=60)
    (path,) = trace_dir.glob("*.trace")
    with TraceReader(path) as reader:
        scheduler_pid = reader.header.pid
    done: list[str] = []

    def send(n: int) -> None:
        rid = f"k9-b{n}"
        try:
            generate(server, rid, 200 + 50 * (n % 7), 4, timeout_s=120)
        except Exception:  # the scheduler is gone: this one never finished
            return
        done.append(rid)

    pool = ThreadPoolExecutor(4)
    for n in range(400):
        pool.submit(send, n)
    try:
        wait_for(lambda: len(done) >= 3 * WRITER_QUEUE, "requests finishing under load", timeout_s=300)
    finally:
        os.kill(scheduler_pid, signal.SIGKILL)
        finished_before_kill = set(done)
        server.stop()  # the rest of the server: the requests in flight fail now
        pool.shutdown(wait=True, cancel_futures=True)
    with TraceReader(path) as reader:
        assert not reader.closed_cleanly and reader.gaps == []
        records = [r for _, r in reader.records()][1:]
    passes = [r.seq for r in records if isinstance(r, Pass)]
    assert passes == list(range(len(passes)))
    arrived = {r.rid for r in records if isinstance(r, Arrival)}
    finished = {r.rid for r in records if isinstance(r, Finish)}
    dropped = sum(r.count for r in records if isinstance(r, Loss))  # a full queue drops, and says so
    # The small queue may drop a record of the first requests too: then the trace says so.
    assert len(set(first) - finished) <= dropped and len(finished - arrived) <= dropped
    missing = finished_before_kill - finished
    assert len(missing) <= 2 * WRITER_QUEUE + dropped, (len(missing), dropped)


def first_settled(records: list, rids: list[str]) -> bool:
    """Every one of ``rids`` has its finish on disk, or a loss record stands for the rest."""
    finished = {r.rid for r in records if isinstance(r, Finish)}
    dropped = sum(r.count for r in records if isinstance(r, Loss))
    return len(set(rids) - finished) <= dropped


def live_records(trace_dir: Path) -> list:
    records = []
    for path in trace_dir.glob("*.trace"):
        with TraceReader(path) as reader:
            records.extend(r for _, r in reader.records())
    return records
