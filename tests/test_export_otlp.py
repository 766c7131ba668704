"""``schedtrace export --format otlp``: spans over OTLP/HTTP to a real receiver on loopback."""

from __future__ import annotations


import pytest

from schedtrace.testing.synthetic import generate
from otel_support import START_WALL_NS, OtlpReceiver, attrs_of, closed_port, run_cli, write_small_trace
from schedtrace.tracer.contract.report import load_report
from schedtrace.tracer.export import otel_attrs as A
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.export.otlp import resolve_endpoint
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import TraceReader, write_trace
from schedtrace.tracer.contract.schema import Clock, KvSnapshot, PoolLayout

# "Does not hang": a generous wall-clock bound, not a performance figure.
HANG_BOUND_S = 60


@pytest.fixture
def receiver():
    server = OtlpReceiver()
    yield server
    server.close()


def test_every_pass_arrives_with_trace_timestamps_and_divergences(tmp_path, receiver):
    trace, report_path = tmp_path / "s.trace", tmp_path / "s.json"
    generate(trace, 3000, report_path=report_path)
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", receiver.base_url,
                   "--report", str(report_path))
    assert done.returncode == 0, done.stderr
    with TraceReader(trace) as reader:
        passes = list(reader.passes())
        start_wall = reader.header.start_wall_ns
    report = load_report(report_path)

    spans = [s for _, s in receiver.spans() if s.name == A.PASS_SPAN]
    assert len(receiver.requests) > 1  # streamed in several batches
    by_seq = {attrs_of(s)[A.PASS_SEQ]: s for s in spans}
    assert len(spans) == len(by_seq) == len(passes)
    for record in passes:
        span = by_seq[record.seq]
        assert span.start_time_unix_nano == start_wall + record.t_ns
        assert span.end_time_unix_nano == start_wall + record.t_ns + record.dur_ns
        assert attrs_of(span)[A.QUEUE_WAITING] == len(record.waiting)
        assert attrs_of(span)[A.KV_FREE] == record.kv.available

    divergences = [(attrs_of(s)[A.PASS_SEQ], e) for s in spans for e in s.events if e.name == A.DIVERGENCE_EVENT]
    assert sorted(seq for seq, _ in divergences) == sorted(d.pass_ for d in report.divergences)
    first = report.divergences[0]
    event = next(e for seq, e in divergences if seq == first.pass_)
    assert attrs_of(event)[A.DIVERGENCE_KINDS] == first.kinds
    assert attrs_of(event)[A.DIVERGENCE_FIXES] == first.fixes
    assert event.time_unix_nano == start_wall + first.t_ns
    stall_events = [e for s in spans for e in s.events if e.name == A.STALL_EVENT]
    assert len(stall_events) == sum(len(v) for v in report.stalls.values())
    errors = [s for s in spans if any(e.name == A.EXCEPTION_EVENT for e in s.events)]
    assert len(errors) == sum(1 for p in passes if p.error)
    resources = {tuple(sorted(r.items())) for r, _ in receiver.spans()}
    assert len(resources) == 1
    assert dict(next(iter(resources)))["service.name"]


def test_small_trace_span_names_and_events(tmp_path, receiver):
    trace = write_small_trace(tmp_path / "t.trace")
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", receiver.base_url + "/v1/traces")
    assert done.returncode == 0, done.stderr
    spans = [s for _, s in receiver.spans()]
    assert sorted(s.name for s in spans) == [A.ORPHAN_SPAN] + [A.PASS_SPAN] * 4
    first = min((s for s in spans if s.name == A.PASS_SPAN), key=lambda s: s.start_time_unix_nano)
    assert first.start_time_unix_nano == START_WALL_NS + 1000
    assert sorted(e.name for e in first.events) == [A.AITER_EVENT, A.ALLOC_FAILED_EVENT]


def test_hybrid_pools_and_clock_records_reach_the_spans(tmp_path, receiver):
    """An SWA trace: each pool's counts and the limiting pool are attributes; a clock record
    moves the spans after it onto the wall clock it gives."""
    layout = PoolLayout("SWATokenToKVPoolAllocator", "SWARadixCache", 40000, swa_size=8000, sliding_window=128)
    kvs = [KvSnapshot(36000, 0, swa_available=7000, swa_evictable=500, protected=0, swa_protected=0),
           KvSnapshot(30000, 1000, swa_available=900, swa_evictable=100, protected=10, swa_protected=20)]
    shift = 3_000_000
    recs = [builders.pass_record(0, t_ns=1000, kv=kvs[0]), Clock(t_ns=1500, wall_ns=START_WALL_NS + 1500 + shift),
            builders.pass_record(1, t_ns=2000, kv=kvs[1])]
    hdr = builders.header(is_hybrid_swa=True, pools=layout, start_wall_ns=START_WALL_NS)
    trace = write_trace(tmp_path / "swa.trace", hdr, recs)
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", receiver.base_url)
    assert done.returncode == 0, done.stderr
    spans = sorted((s for _, s in receiver.spans() if s.name == A.PASS_SPAN), key=lambda s: attrs_of(s)[A.PASS_SEQ])
    assert [s.start_time_unix_nano for s in spans] == [START_WALL_NS + 1000, START_WALL_NS + 2000 + shift]
    first, second = (attrs_of(s) for s in spans)
    assert (first[A.KV_LIMITING_POOL], second[A.KV_LIMITING_POOL]) == ("full", "swa")
    assert (second[A.KV_SWA_FREE], second[A.KV_SWA_EVICTABLE], second[A.KV_SWA_PROTECTED], second[A.KV_PROTECTED]) \
        == (900, 100, 20, 10)
    assert A.KV_MAMBA_FREE not in second
    plain = write_small_trace(tmp_path / "t.trace")
    receiver.requests.clear()
    assert run_cli("export", str(plain), "--format", "otlp", "--endpoint", receiver.base_url).returncode == 0
    assert not any(A.KV_LIMITING_POOL in attrs_of(s) or A.KV_SWA_FREE in attrs_of(s) for _, s in receiver.spans())


def test_every_rank_is_sent_with_its_own_resource(tmp_path, receiver):
    for tp in (0, 1):
        hdr = builders.header(run_id="run-x", tp_rank=tp, tp_size=2, pid=100 + tp, start_wall_ns=START_WALL_NS)
        write_trace(tmp_path / f"tp{tp}.trace", hdr, [builders.pass_record(n, t_ns=(n + 1) * 1000) for n in range(3)])
    done = run_cli("export", str(tmp_path), "--format", "otlp", "--endpoint", receiver.base_url)
    assert done.returncode == 0, done.stderr
    assert "tp0: sent 3 pass spans" in done.stderr and "tp1: sent 3 pass spans" in done.stderr
    by_pid: dict = {}
    for resource, span in receiver.spans():
        by_pid.setdefault(resource["process.pid"], set()).add(attrs_of(span)[A.TP_RANK])
    assert by_pid == {100: {0}, 101: {1}}


def test_unreachable_endpoint_retries_within_its_bound_then_exits_2(tmp_path):
    trace = write_small_trace(tmp_path / "t.trace")
    url = f"http://127.0.0.1:{closed_port()}"
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", url, "--timeout", "2",
                   timeout=HANG_BOUND_S)  # a hang is a failure (TimeoutExpired), not a measured time
    assert done.returncode == 2
    assert "unreachable" in done.stderr and url in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_failing_collector_is_retried_then_given_up(tmp_path):
    trace = write_small_trace(tmp_path / "t.trace")
    busy = OtlpReceiver(status=503)
    try:
        done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", busy.base_url, "--timeout", "4",
                       timeout=HANG_BOUND_S)
    finally:
        busy.close()
    assert done.returncode == 2, done.stderr
    assert busy.attempts >= 2  # retried, then stopped
    assert "Traceback" not in done.stderr


def test_corrupt_trace_exits_2_with_the_offset(tmp_path, receiver):
    trace = write_small_trace(tmp_path / "t.trace")
    data = bytearray(trace.read_bytes())
    with TraceReader(trace) as reader:
        offset = reader.pass_offsets[1]
    data[offset] = 0xC1
    trace.write_bytes(bytes(data))
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", receiver.base_url)
    assert done.returncode == 2
    assert f"offset {offset}" in done.stderr and "Traceback" not in done.stderr


def test_endpoint_resolution():
    assert resolve_endpoint("http://127.0.0.1:4318", {}) == "http://127.0.0.1:4318/v1/traces"
    assert resolve_endpoint("http://127.0.0.1:4318/custom", {}) == "http://127.0.0.1:4318/custom"
    assert resolve_endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:5/"}) == \
        "http://127.0.0.1:5/v1/traces"
    assert resolve_endpoint(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:6/x"}) == \
        "http://127.0.0.1:6/x"
    assert resolve_endpoint(None, {}) == "http://localhost:4318/v1/traces"
    with pytest.raises(UsageError):
        resolve_endpoint("127.0.0.1:4318", {})
