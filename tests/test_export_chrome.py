"""``schedtrace export --format chrome``: Trace Event Format JSON for Perfetto UI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from schedtrace.testing import builders
from schedtrace.testing.synthetic import generate
from otel_support import START_WALL_NS, header, records, run_cli, write_small_trace
from schedtrace.tracer.contract.report import load_report
from schedtrace.tracer.analysis.stalls import recorded_stalls
from schedtrace.tracer.export.chrome import COUNTERS, DEFAULT_STALL_PASSES, TID_DIVERGENCES, TID_EVENTS, TID_PASSES, TID_STALLS
from schedtrace.tracer.contract.format import TraceReader, TraceWriter, write_trace
from schedtrace.tracer.contract.schema import Alloc, Arrival, Clock, Finish, KvSnapshot, Pass, PoolLayout, WaitingReq

PASSES = 10_500  # two planted stall windows, failed allocations, one raising pass


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chrome")
    trace, report = folder / "s.trace", folder / "s.json"
    generate(trace, PASSES, report_path=report)
    return trace, report


def _export(trace, out, *extra) -> dict:
    done = run_cli("export", str(trace), "--format", "chrome", "-o", str(out), *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _check_trace_event_format(doc: dict) -> list[dict]:
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    names = {}
    for event in events:
        assert event["ph"] in {"M", "X", "C", "i", "b", "e"}
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        if event["ph"] == "M":
            names[(event["name"], event["tid"])] = event["args"]["name"] if "name" in event["args"] else None
            continue
        assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0
        if event["ph"] == "i":
            assert event["s"] in {"g", "p", "t"}
        if event["ph"] in "be":
            assert event["cat"] and event["id"]
        if event["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in event["args"].values())
    # Every track used is named.
    assert ("process_name", 0) in names
    for tid in {e["tid"] for e in events if e["ph"] in "Xi"}:
        assert ("thread_name", tid) in names
    # Timestamps never go back on a track (slices and instants per thread, each counter, each request).
    last: dict = defaultdict(float)
    for event in events:
        if event["ph"] == "M":
            continue
        key = (event["ph"] in "Xi" and event["tid"], event["name"] if event["ph"] == "C" else None,
               event.get("id"))
        assert event["ts"] >= last[key], event
        last[key] = event["ts"]
    return events


def test_chrome_json_round_trips_the_trace_counts(synthetic, tmp_path):
    trace, report_path = synthetic
    doc = _export(trace, tmp_path / "out.json", "--report", str(report_path))
    events = _check_trace_event_format(doc)
    report = load_report(report_path)
    with TraceReader(trace) as reader:
        recs = [r for _, r in reader.records()]
    passes = [r for r in recs if isinstance(r, Pass)]

    slices = [e for e in events if e["ph"] == "X"]
    assert [e["args"]["seq"] for e in slices] == [p.seq for p in passes]
    assert all(e["tid"] == TID_PASSES for e in slices)
    assert [e["ts"] for e in slices] == [p.t_ns / 1000 for p in passes]
    assert [e["dur"] for e in slices] == [p.dur_ns / 1000 for p in passes]

    # Counters replay exactly the per-pass values (emitted when they change).
    series = {name: [] for name in COUNTERS}
    for event in events:
        if event["ph"] == "C":
            series[event["name"]].append(event["args"]["value"])
    def changes(values):
        out = []
        for v in values:
            if not out or out[-1] != v:
                out.append(v)
        return out
    assert series["queue depth"] == changes([len(p.waiting) for p in passes])
    assert series["running"] == changes([len(p.running) for p in passes])
    assert series["KV free"] == changes([p.kv.available for p in passes])
    assert series["KV evictable"] == changes([p.kv.evictable for p in passes])

    instants = Counter((e["tid"], e["name"].split(":")[0]) for e in events if e["ph"] == "i")
    failed_allocs = sum(1 for r in recs if isinstance(r, Alloc) and not r.ok)
    assert failed_allocs > 0
    assert instants[(TID_EVENTS, "alloc failed")] == failed_allocs
    assert instants[(TID_EVENTS, "exception")] == sum(1 for p in passes if p.error) == 1
    assert instants[(TID_DIVERGENCES, "divergence")] == len(report.divergences)
    assert instants[(TID_STALLS, "stall (stock)")] == len(report.stalls["stock"]) > 0

    # Per-request async slices: balanced, one outer slice per arrival, closed at finish.
    arrivals = {r.rid for r in recs if isinstance(r, Arrival)}
    finished = {r.rid for r in recs if isinstance(r, Finish)}
    outer = [e for e in events if e["ph"] == "b" and e["name"] == e["id"]]
    assert {e["id"] for e in outer} == arrivals
    depth: Counter = Counter()
    for event in events:
        if event["ph"] == "b":
            depth[event["id"]] += 1
        elif event["ph"] == "e":
            depth[event["id"]] -= 1
            assert depth[event["id"]] >= 0
    assert set(depth.values()) == {0}
    ends = {e["id"]: e for e in events if e["ph"] == "e" and e["name"] == e["id"]}
    assert {rid for rid, e in ends.items() if "reason" in e.get("args", {})} == finished
    queued = [e for e in events if e["ph"] == "e" and e["name"] == "queued"]
    assert len(queued) >= len(finished)  # every finished request was admitted once at least


def test_without_a_report_stalls_come_from_the_recorded_decisions(synthetic, tmp_path):
    trace, report_path = synthetic
    doc = _export(trace, tmp_path / "out.json")
    events = _check_trace_event_format(doc)
    found = [e for e in events if e["ph"] == "i" and e["tid"] == TID_STALLS]
    found_runs = [(e["args"]["start_pass"], e["args"]["end_pass"], e["args"]["passes"], e["args"]["head_rid"]) for e in found]
    with TraceReader(trace) as reader:
        passes = list(reader.passes())
        expected = recorded_stalls(passes, DEFAULT_STALL_PASSES, reader.header)
    assert expected  # the generator plants latched windows
    assert found_runs == [(s.start_pass, s.end_pass, s.passes, s.head_rid) for s in expected]
    assert [e["ts"] for e in found] == [passes[s.start_pass].t_ns / 1000 for s in expected]  # at each onset
    planted = load_report(report_path).stalls["stock"]
    assert {s.start_pass for s in planted} <= {s.start_pass for s in expected}
    assert not [e for e in events if e["tid"] == TID_DIVERGENCES and e["ph"] != "M"]


def test_small_trace_to_stdout(tmp_path):
    trace = write_small_trace(tmp_path / "t.trace")
    done = run_cli("export", str(trace), "--format", "chrome", "-o", "-")
    assert done.returncode == 0, done.stderr
    events = _check_trace_event_format(json.loads(done.stdout))
    assert Counter(e["name"] for e in events if e["ph"] == "X") == {
        "admitted": 1, "rejected": 1, "error": 1, "chunk": 1}
    names = {e["name"] for e in events if e["ph"] == "i"}
    assert names == {"alloc failed", "exception", "hook error", "records lost"}


def test_corrupt_trace_exits_2_with_the_offset_and_leaves_no_output(tmp_path):
    trace = write_small_trace(tmp_path / "t.trace")
    data = bytearray(trace.read_bytes())
    with TraceReader(trace) as reader:
        offset = reader.pass_offsets[2]
    data[offset] = 0xC1  # a byte msgpack never uses
    trace.write_bytes(bytes(data))
    out = tmp_path / "out.json"
    done = run_cli("export", str(trace), "--format", "chrome", "-o", str(out))
    assert done.returncode == 2
    assert f"offset {offset}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_truncated_trace_exports_its_valid_prefix(tmp_path):
    trace = tmp_path / "cut.trace"
    writer = TraceWriter(trace, header())
    writer.write_many(records())
    writer.abandon()  # killed recorder: no footer ...
    with open(trace, "r+b") as file:  # ... and a torn last record
        file.truncate(trace.stat().st_size - 3)
    with TraceReader(trace) as reader:
        expected = reader.pass_count
    out = tmp_path / "out.json"
    done = run_cli("export", str(trace), "--format", "chrome", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "not closed cleanly" in done.stderr
    events = _check_trace_event_format(json.loads(out.read_text()))
    assert sum(1 for e in events if e["ph"] == "X") == expected == 4


def test_missing_trace_and_bad_options_exit_2(tmp_path):
    done = run_cli("export", str(tmp_path / "nope.trace"), "--format", "chrome")
    assert done.returncode == 2 and "no such file" in done.stderr
    trace = write_small_trace(tmp_path / "t.trace")
    done = run_cli("export", str(trace), "--format", "chrome", "--endpoint", "http://127.0.0.1:1")
    assert done.returncode == 2 and "--endpoint" in done.stderr


def test_another_traces_report_is_refused_in_one_line_and_exit_2(synthetic, tmp_path):
    """A report names its trace by fingerprint; one from another trace is refused before any output,
    and one without a fingerprint is still refused when it names passes the trace does not have."""
    import msgspec

    from schedtrace.tracer.contract.report import dump_report

    trace, report_path = synthetic
    other = tmp_path / "other.trace"
    generate(other, 600, seed=5)
    with TraceReader(other) as reader:
        other_print = reader.fingerprint()
    stamped = tmp_path / "stamped.json"
    stamped.write_bytes(dump_report(msgspec.structs.replace(load_report(report_path), trace_fingerprint=other_print)))
    for report, expected in ((stamped, "fingerprints differ"), (report_path, "passes")):
        out = tmp_path / "out.json"
        done = run_cli("export", str(trace if report is stamped else other), "--format", "chrome", "-o", str(out),
                       "--report", str(report))
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("schedtrace: error: ") and str(report) in line and expected in line
        assert not out.exists() and not list(tmp_path.glob("*.partial"))
    with TraceReader(trace) as reader:  # its own trace's fingerprint: accepted
        own = tmp_path / "own.json"
        own.write_bytes(dump_report(msgspec.structs.replace(load_report(report_path),
                                                            trace_fingerprint=reader.fingerprint())))
    _export(trace, tmp_path / "ok.json", "--report", str(own))


# --- several ranks on one timeline ------------------------------------------------

MS = 1_000_000


def rank_trace(folder, tp: int, start_wall_ns: int, clock_shift_ns: int = 0):
    """Five passes 1 ms apart and one request; from pass 2 on, a clock record moves the rank's wall clock."""
    head = WaitingReq("r1", 100, 0, 16, 0)
    recs: list = [Arrival(t_ns=500_000, rid="r1", input_len=100, max_new_tokens=16)]
    for n in range(5):
        if n == 2 and clock_shift_ns:
            recs.append(Clock(t_ns=n * MS, wall_ns=start_wall_ns + n * MS + clock_shift_ns))
        recs.append(builders.pass_record(n, t_ns=(n + 1) * MS, dur_ns=100_000, waiting=[head] if n < 3 else [],
                                         kv=KvSnapshot(available=5000 - n, evictable=0)))
    recs.append(Finish(t_ns=7 * MS, rid="r1", output_len=16, reason="length"))
    hdr = builders.header(run_id="run-x", tp_rank=tp, tp_size=2, pid=100 + tp, start_wall_ns=start_wall_ns)
    return write_trace(folder / f"schedtrace-run-x-h-tp{tp}-dp0-pp0-pid{100 + tp}.part000.trace", hdr, recs)


def test_two_ranks_are_two_processes_on_one_wall_clock_timeline(tmp_path):
    """tp1 started 0.5 ms after tp0, and its clock record at pass 2 moves it 2 ms later still."""
    rank_trace(tmp_path, 0, START_WALL_NS)
    rank_trace(tmp_path, 1, START_WALL_NS + 500_000, clock_shift_ns=2 * MS)
    doc = _export(tmp_path, tmp_path / "out.json")
    events = _check_trace_event_format(doc)
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [1, 2] and "tp0" in names[1] and "tp1" in names[2]
    slices = [e for e in events if e["ph"] == "X"]
    # Wall time since the earlier start, in µs: tp1 +500, and +2000 more from its clock record on.
    expected = {1: [1000.0, 2000.0, 3000.0, 4000.0, 5000.0], 2: [1500.0, 2500.0, 5500.0, 6500.0, 7500.0]}
    assert {pid: [e["ts"] for e in slices if e["pid"] == pid] for pid in (1, 2)} == expected
    assert [e["ts"] for e in slices] == sorted(e["ts"] for e in slices)  # merged in wall-time order
    assert [e["pid"] for e in slices] == [1, 2, 1, 2, 1, 1, 1, 2, 2, 2]
    # A rid on both ranks is two requests, one per process.
    outer = {(e["pid"], e["id"]) for e in events if e["ph"] == "b" and e["name"] == "r1"}
    assert outer == {(1, "tp0/r1"), (2, "tp1/r1")}
    assert doc["otherData"]["start_wall_ns"] == START_WALL_NS


def test_one_rank_of_several_exports_alone(tmp_path):
    rank_trace(tmp_path, 0, START_WALL_NS)
    rank_trace(tmp_path, 1, START_WALL_NS + 500_000)
    events = _check_trace_event_format(_export(tmp_path, tmp_path / "out.json", "--rank", "tp1"))
    assert [e["ts"] for e in events if e["ph"] == "X"] == [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
    assert {e["pid"] for e in events} == {1}
    done = run_cli("export", str(tmp_path), "--format", "chrome", "--report", str(tmp_path / "r.json"))
    assert done.returncode == 2 and "--report covers one rank" in done.stderr and "--rank" in done.stderr


def test_hybrid_pools_are_counters_and_pass_args(tmp_path):
    layout = PoolLayout("SWATokenToKVPoolAllocator", "SWARadixCache", 40000, swa_size=8000, sliding_window=128)
    kvs = [KvSnapshot(36000, 0, swa_available=7000, swa_evictable=500, protected=0, swa_protected=0),
           KvSnapshot(30000, 1000, swa_available=900, swa_evictable=100, protected=10, swa_protected=20)]
    trace = write_trace(tmp_path / "swa.trace", builders.header(is_hybrid_swa=True, pools=layout),
                        [builders.pass_record(n, kv=kv) for n, kv in enumerate(kvs)])
    events = _check_trace_event_format(_export(trace, tmp_path / "out.json"))
    args = [e["args"] for e in events if e["ph"] == "X"]
    assert [a["limiting_pool"] for a in args] == ["full", "swa"]  # 0.90 vs 0.94, then 0.78 vs 0.13
    assert [(a["swa_free"], a["swa_evictable"], a["swa_protected"]) for a in args] == [(7000, 500, 0), (900, 100, 20)]
    assert "mamba_free" not in args[0]
    counters = [(e["name"], e["args"]["value"]) for e in events if e["ph"] == "C" and e["name"].startswith("SWA")]
    assert counters == [("SWA free", 7000), ("SWA evictable", 500), ("SWA free", 900), ("SWA evictable", 100)]
    plain = _check_trace_event_format(_export(write_small_trace(tmp_path / "t.trace"), tmp_path / "plain.json"))
    assert not {e["name"] for e in plain if e["ph"] == "C"} & {"SWA free", "mamba free"}
    assert not any("limiting_pool" in e["args"] for e in plain if e["ph"] == "X")


def test_the_perfetto_export_needs_no_opentelemetry() -> None:
    """``export --format chrome`` runs where only the base dependencies are installed."""
    code = ("import sys, schedtrace.tracer.export.chrome; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"  # before: opentelemetry, through the OTel mirror's pass_result
