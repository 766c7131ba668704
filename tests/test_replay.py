"""Open-loop replay through sglang's own scheduler code (no mocks of sglang parts)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import msgpack
import pytest

import repro_traces as repro
from schedtrace.replay.engine import replay_trace
from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.contract.report import Decision, dump_report, load_report
from schedtrace.tracer.analysis.stalls import find_stalls
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, write_trace
from schedtrace.tracer.contract.schema import KvSnapshot, WaitingReq

# (builder, fix, the divergence kind that fix must show)
REPROS = [
    (repro.chunk_cap_trace, "chunk-cap", "chunk"),
    (repro.latch_trace, "latch", "batch_is_full"),
    (repro.aiter_trace, "aiter", "aiter"),
]


@pytest.mark.parametrize(("build", "fix", "kind"), REPROS, ids=[r[1] for r in REPROS])
@pytest.mark.parametrize("new", ["fixed", "alone"])
def test_repro_trace_shows_the_fix(tmp_path: Path, build, fix: str, kind: str, new: str) -> None:
    arm = fix if new == "alone" else "fixed"
    report = replay_trace(build(tmp_path / "t.trace"), "stock", arm)
    assert report.fidelity.matched == report.fidelity.total > 0, report.fidelity.mismatches
    assert report.divergences, "stock and the fix decided the same"
    for divergence in report.divergences:
        assert kind in divergence.kinds
        assert divergence.fixes == [fix]


def test_chunk_cap_stock_over_asks_and_fix_defers(tmp_path: Path) -> None:
    report = replay_trace(repro.chunk_cap_trace(tmp_path / "t.trace"), "stock", "chunk-cap")
    (d,) = report.divergences
    assert d.kinds == ["admitted", "chunk", "over_ask"]
    assert d.old.chunk_size == repro.CHUNK and d.old.over_ask == repro.CHUNK
    assert d.new.chunk_size is None and d.new.admitted == [] and d.new.over_ask == 0


def test_latch_stalls_stock_only(tmp_path: Path) -> None:
    report = replay_trace(repro.latch_trace(tmp_path / "t.trace", passes=10), "stock", "latch", stall_passes=5)
    assert [(s.start_pass, s.end_pass, s.passes, s.head_rid) for s in report.stalls["stock"]] == [(0, 9, 10, "queued")]
    assert report.stalls["latch"] == []
    assert all(d.new.admitted == [("queued", 2000)] for d in report.divergences)


def test_recorded_grid_reaches_the_real_prefill_adder(tmp_path: Path) -> None:
    """The header's mamba_chunk_grid floors the cut continuing chunk (960 of 1000),
    and the scheduler's truncation alignment (derived from it by the real
    ``init_mamba_truncation_align``) empties the 40-token leftover on the radix path."""
    path = repro.one_chunk_radix_trace(tmp_path / "t.trace")
    report = replay_trace(path, "stock", "fixed")
    assert report.fidelity.matched == report.fidelity.total == 1, report.fidelity.mismatches
    with TraceReader(path) as reader:
        driver = PassDriver(reader.header)
        p = reader.pass_at(0)
    assert driver.scheduler.truncation_align_size == repro.GRID
    decision = driver.decide(p, "stock")
    assert decision.chunk_size == repro.GRID_CHUNK and decision.chunk_budget == repro.SMALL_CHUNK
    assert decision.admitted == [("first", repro.GRID_CHUNK)] and decision.error is None


def test_one_chunk_repro_stock_raises_the_scheduler_assert(tmp_path: Path) -> None:
    path = repro.one_chunk_trace(tmp_path / "t.trace")
    report = replay_trace(path, "stock", "fixed")
    assert report.fidelity.matched == report.fidelity.total == 1, report.fidelity.mismatches
    (error,) = report.errors["stock"]
    assert error.error.startswith("AssertionError")
    with TraceReader(path) as reader:
        stock = PassDriver(reader.header).decide(reader.pass_at(0), "stock")
    # The second request was chunked while the first still is: two chunks, one slot.
    assert stock.admitted == [("first", repro.GRID_CHUNK), ("second", repro.LEFTOVER)]


@pytest.mark.parametrize("arm", ["one-chunk", "fixed"])
def test_one_chunk_fix_prevents_the_second_chunk(tmp_path: Path, arm: str) -> None:
    report = replay_trace(repro.one_chunk_trace(tmp_path / "t.trace"), "stock", arm)
    assert report.errors[arm] == []
    (d,) = report.divergences
    assert "error" in d.kinds and "one-chunk" in d.fixes


def test_one_chunk_repro_trips_the_cli_error_gate(tmp_path: Path) -> None:
    from schedtrace.cli import main

    path = repro.one_chunk_trace(tmp_path / "t.trace")
    with pytest.raises(SystemExit) as info:
        main(["replay", str(path), "--old", "fixed", "--new", "stock", "--fail-on", "error"])
    assert info.value.code == 1
    main(["replay", str(path), "--old", "stock", "--new", "latch", "--fail-on", "divergence"])  # same decision: exit 0


def test_report_is_deterministic(tmp_path: Path) -> None:
    path = repro.latch_trace(tmp_path / "t.trace")
    first = dump_report(replay_trace(path, "stock", "fixed"))
    second = dump_report(replay_trace(path, "stock", "fixed"))
    assert first == second
    (tmp_path / "r.json").write_bytes(first)
    assert dump_report(load_report(tmp_path / "r.json")) == first


def test_driver_reads_only_inputs(tmp_path: Path) -> None:
    """Outputs of the record do not change the decision."""
    path = repro.latch_trace(tmp_path / "t.trace", passes=1)
    with TraceReader(path) as reader:
        driver = PassDriver(reader.header)
        p = reader.pass_at(0)
    import msgspec

    scrubbed = msgspec.structs.replace(p, admitted=[], candidates=[], batch_is_full_out=False, chunk=None)
    assert driver.decide(p, "stock") == driver.decide(scrubbed, "stock")


def test_truncated_trace_replays_its_prefix(tmp_path: Path) -> None:
    path = repro.latch_trace(tmp_path / "t.trace", passes=10)
    with TraceReader(path) as reader:
        cut = reader.pass_offsets[7] + 5  # inside pass 7
    data = path.read_bytes()[:cut]
    torn = tmp_path / "torn.trace"
    torn.write_bytes(data)
    report = replay_trace(torn, "stock", "fixed")
    assert report.passes == 7
    assert report.truncated_at == cut - 5
    assert any("torn" in w for w in report.warnings)


def test_a_corrupt_record_is_a_hole_replay_reads_past(tmp_path: Path, capsys) -> None:
    path = repro.latch_trace(tmp_path / "t.trace", passes=4)
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[2]
        passes = reader.pass_count
    data = bytearray(path.read_bytes())
    data[offset] = 0xC1  # a byte msgpack never uses
    bad = tmp_path / "bad.trace"
    bad.write_bytes(bytes(data))
    report = replay_trace(bad, "stock", "fixed")
    (region,) = report.holes.regions
    assert region.start <= offset < region.end and region.passes_lost >= 1
    assert report.fidelity.total == passes - report.holes.passes_lost  # over the passes present

    from schedtrace.cli import main

    main(["replay", str(bad)])  # returns: holes warn, they do not fail by default
    captured = capsys.readouterr()
    assert "bytes unreadable at offset" in captured.out + captured.err and "Traceback" not in captured.err
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", str(bad), "--fail-on", "gaps"])
    assert exit_info.value.code == 1


def test_unknown_records_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "u.trace"
    source = repro.latch_trace(tmp_path / "src.trace", passes=3)
    with TraceReader(source) as reader:
        header, passes = reader.header, list(reader.passes())
    writer = TraceWriter(path, header)
    writer.write(passes[0])
    writer.abandon()
    with open(path, "ab") as f:
        f.write(msgpack.packb(["from-the-future", 1, 2]))
    writer = None
    from schedtrace.tracer.contract.format import encode

    with open(path, "ab") as f:
        f.write(encode(passes[1]))
    report = replay_trace(path, "stock", "fixed")
    assert report.unknown_records == {"from-the-future": 1}
    assert report.passes == 2


def test_other_sglang_version_warns(tmp_path: Path) -> None:
    with TraceReader(repro.latch_trace(tmp_path / "src.trace", passes=2)) as reader:
        passes = list(reader.passes())
    path = write_trace(tmp_path / "old.trace", repro.header(sglang_version="0.4.0"), passes)
    report = replay_trace(path, "stock", "fixed")
    assert report.trace_sglang_version == "0.4.0"
    assert any("0.4.0" in w for w in report.warnings)
    assert report.fidelity.matched == report.fidelity.total == 2


def test_cli_gate_exit_codes(tmp_path: Path, capsys) -> None:
    from schedtrace.cli import main

    path = repro.latch_trace(tmp_path / "t.trace", passes=3)
    out = tmp_path / "r.json"
    main(["replay", str(path), "--fail-on", "none", "--json", str(out)])  # returns: exit 0
    assert load_report(out).divergences
    with pytest.raises(SystemExit) as info:
        main(["replay", str(path), "--fail-on", "divergence"])
    assert info.value.code == 1
    with pytest.raises(SystemExit) as info:
        main(["replay", str(path), "--new", "no-such-fix"])
    assert info.value.code == 2
    assert "no-such-fix" in capsys.readouterr().err


def test_find_stalls_counts_folded_passes_and_breaks_on_idle(tmp_path: Path) -> None:
    waiting = [WaitingReq("a", 100, 0, 10, 0)]
    fits = KvSnapshot(available=1000, evictable=0)
    none = Decision(admitted=[])
    p = lambda seq, repeat=1, idle=0, kv=fits: repro.make_pass(seq, waiting=waiting, kv=kv, repeat=repeat, idle_before=idle)  # noqa: E731
    passes = [p(0, repeat=3), p(1), p(2, idle=4), p(3), p(4, kv=KvSnapshot(available=10, evictable=0))]
    stalls = find_stalls(passes, [none] * 5, 4)
    assert [(s.start_pass, s.end_pass, s.passes) for s in stalls] == [(0, 1, 4)]
    assert find_stalls(passes, [Decision(admitted=[("a", 100)])] * 5, 1) == []


def test_stock_replays_a_real_sandbox_trace_exactly(sandbox) -> None:
    """Fidelity 100% on a trace the real server recorded under chunked prefill and KV pressure."""
    from conftest import generate

    lengths = [1500, 9000, 3000, 12000, 2500, 4500, 7000, 2000, 10000, 3500, 6000, 1800, 5000, 8000]
    with concurrent.futures.ThreadPoolExecutor(len(lengths)) as pool:
        futures = [
            pool.submit(generate, sandbox, f"test-replay-{n}", length, 40) for n, length in enumerate(lengths)
        ]
        for f in futures:
            f.result()
    traces = sorted(Path(sandbox.trace_dir).glob("*.trace"))
    assert traces, f"no trace in {sandbox.trace_dir}"
    total = 0
    for trace in traces:
        report = replay_trace(trace, "stock", "fixed")
        fid = report.fidelity
        assert fid.matched == fid.total, [(m.pass_, m.fields, m.recorded, m.replayed) for m in fid.mismatches[:5]]
        total += fid.total
    assert total > 0


# --- a candidate whose cached prefix a running request already pins ------------

SHARED_PREFIX = 3000
UNPINNED = 500  # of the shared prefix, what no running request had locked yet


def pinned_prefix_trace(path: Path, locked_evictable: int | None = UNPINNED) -> Path:
    """lpm: ``cached`` matches 3000 tokens that ``sibling`` (running, same prompt)
    already locks but for 500. Pinning the match takes only those 500 from the
    700 evictable, so its 1 + 300 tokens fit in 400 free + 200 evictable; taking
    the whole match (what a trace without ``locked_evictable`` implies) leaves 0."""
    from schedtrace.tracer.contract.schema import Admitted, Candidate, RunningReq

    waiting = [
        WaitingReq("fresh", 2000, 0, 300, 0, None, True),
        WaitingReq("cached", SHARED_PREFIX + 1, 0, 300, SHARED_PREFIX, None, True),
    ]
    p = repro.make_pass(
        0,
        waiting=waiting,
        running=[RunningReq("sibling", SHARED_PREFIX, 100, 300, True)],
        kv=KvSnapshot(available=400, evictable=700),
        req_slots_free=11,
        candidates=[
            Candidate("cached", SHARED_PREFIX, 1, "CONTINUE", locked_evictable),
            Candidate("fresh", 0, 0, "NO_TOKEN", None if locked_evictable is None else 0),
        ],
        admitted=[Admitted("cached", SHARED_PREFIX, 1)],
        batch_is_full_out=True,
    )
    return write_trace(path, repro.header("lpm"), [p])


def test_recorded_lock_drop_replays_a_partly_pinned_prefix(tmp_path: Path) -> None:
    report = replay_trace(pinned_prefix_trace(tmp_path / "t.trace"), "stock", "fixed")
    assert report.fidelity.matched == report.fidelity.total == 1, report.fidelity.mismatches


def test_without_the_lock_drop_the_whole_prefix_counts_as_evictable(tmp_path: Path) -> None:
    """An older trace (no ``locked_evictable``) falls back to pinning the whole
    match, which is exactly what mis-replays this pass."""
    report = replay_trace(pinned_prefix_trace(tmp_path / "old.trace", None), "stock", "fixed")
    (mismatch,) = report.fidelity.mismatches
    assert "admitted" in mismatch.fields and mismatch.replayed.admitted == []


@pytest.mark.parametrize(("drop", "admitted"), [(0, True), (UNPINNED, True), (600, False), (SHARED_PREFIX, False)])
def test_stand_in_takes_exactly_the_recorded_drop(tmp_path: Path, drop: int, admitted: bool) -> None:
    with TraceReader(pinned_prefix_trace(tmp_path / "t.trace", drop)) as reader:
        driver = PassDriver(reader.header)
        p = reader.pass_at(0)
    decision = driver.decide(p, "stock")
    assert decision.admitted == ([("cached", 1)] if admitted else [])
    # Admission keeps the prefix locked: the count left is what the pin did not take.
    assert driver.tree_cache.evictable == (700 - drop if admitted else 700)
