"""``schedtrace export --format otlp``: spans over OTLP/HTTP to a real receiver on loopback."""

from __future__ import annotations

import time

import pytest

from schedtrace.tracer.contract.synthetic import generate
from otel_support import START_WALL_NS, OtlpReceiver, attrs_of, closed_port, run_cli, write_small_trace
from schedtrace.tracer.contract.report import load_report
from schedtrace.tracer.export import otel_attrs as A
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.export.otlp import resolve_endpoint
from schedtrace.tracer.contract.format import TraceReader

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


def test_unreachable_endpoint_retries_within_its_bound_then_exits_2(tmp_path):
    trace = write_small_trace(tmp_path / "t.trace")
    url = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    done = run_cli("export", str(trace), "--format", "otlp", "--endpoint", url, "--timeout", "2",
                   timeout=HANG_BOUND_S)
    assert time.monotonic() - started < HANG_BOUND_S
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
