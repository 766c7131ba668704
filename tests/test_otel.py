"""The live span mirror through the real OpenTelemetry SDK (InMemorySpanExporter),
the recorder's writer-thread sink interface, and the SDK set-up from OTEL_* variables."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_support import REPO, START_WALL_NS, OtlpReceiver, attrs_of, header, records, write_small_trace
from schedtrace.tracer.export import otel_attrs as A
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.export.otel_attrs import pass_result
from schedtrace.tracer.export.otel_mirror import make_sink
from schedtrace.tracer.export.otel_sdk import requested_exporters
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tracer.recorder.writer_thread import WriterThread

ON = {"SCHEDTRACE_OTEL": "1"}


@pytest.fixture
def memory():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _mirror_file(path, provider, *, batch: int) -> list:
    """Feed a trace file to the sink in batches of ``batch`` records, like the writer thread."""
    with TraceReader(path) as reader:
        sink = make_sink(reader.header, tracer_provider=provider, environ=ON, configure_sdk=False, linger_s=60)
        recs = [r for _, r in reader.records()]
    for i in range(0, len(recs), batch):
        sink(recs[i : i + batch])
    sink.close()
    assert not sink.failed
    return recs


def test_sink_is_off_unless_enabled():
    assert make_sink(environ={}) is None
    assert make_sink(environ={"SCHEDTRACE_OTEL": "0"}) is None
    assert make_sink(environ=ON) is not None


@pytest.mark.parametrize("batch", [1, 3, 100])
def test_one_span_per_pass_with_attributes_and_events(tmp_path, memory, batch):
    provider, exporter = memory
    recs = _mirror_file(write_small_trace(tmp_path / "t.trace"), provider, batch=batch)
    spans = exporter.get_finished_spans()
    passes = [r for r in recs if isinstance(r, Pass)]
    pass_spans = sorted((s for s in spans if s.name == A.PASS_SPAN), key=lambda s: s.attributes[A.PASS_SEQ])
    assert [s.attributes[A.PASS_SEQ] for s in pass_spans] == [p.seq for p in passes]

    for span, record in zip(pass_spans, passes):
        assert span.start_time == START_WALL_NS + record.t_ns
        assert span.end_time == START_WALL_NS + record.t_ns + record.dur_ns
        attrs = span.attributes
        assert attrs[A.QUEUE_WAITING] == len(record.waiting)
        assert attrs[A.BATCH_RUNNING] == len(record.running)
        assert attrs[A.KV_FREE] == record.kv.available
        assert attrs[A.KV_EVICTABLE] == record.kv.evictable
        assert attrs[A.ADMITTED] == len(record.admitted)
        assert attrs[A.BATCH_IS_FULL_OUT] == record.batch_is_full_out
        assert attrs[A.PASS_RESULT] == pass_result(record)
        assert attrs[A.PASS_REPEAT] == record.repeat
        assert attrs[A.DP_RANK] == 1
        assert all(k.startswith("schedtrace.") for k in attrs)

    results = [s.attributes[A.PASS_RESULT] for s in pass_spans]
    assert results == [A.RESULT_ADMITTED, A.RESULT_REJECTED, A.RESULT_ERROR, A.RESULT_CHUNK]
    assert pass_spans[0].attributes[A.ADMITTED_TOKENS] == 100
    assert pass_spans[3].attributes[A.CHUNK_SIZE] == 512
    assert A.CHUNK_SIZE not in pass_spans[0].attributes

    # Pass 0: the failed alloc and the aiter choice; the successful alloc is not an event.
    events0 = {e.name: e for e in pass_spans[0].events}
    assert set(events0) == {A.ALLOC_FAILED_EVENT, A.AITER_EVENT}
    assert events0[A.ALLOC_FAILED_EVENT].attributes[A.ALLOC_REQUESTED] == 9000
    assert events0[A.ALLOC_FAILED_EVENT].timestamp == START_WALL_NS + 1400
    assert events0[A.AITER_EVENT].attributes[A.AITER_METHOD] == "chunked"
    # Pass 1: the hook error; pass 2: the exception, with an error status; pass 2 also gets the loss.
    assert [e.name for e in pass_spans[1].events] == [A.HOOK_ERROR_EVENT]
    exc = [e for e in pass_spans[2].events if e.name == A.EXCEPTION_EVENT]
    assert exc and exc[0].attributes[A.EXCEPTION_TYPE] == "AssertionError"
    assert exc[0].attributes[A.EXCEPTION_MESSAGE] == "two chunked requests"
    assert pass_spans[2].status.status_code is StatusCode.ERROR
    assert A.LOSS_EVENT in [e.name for e in pass_spans[2].events]
    assert pass_spans[0].status.status_code is StatusCode.UNSET

    # The alloc failure of pass 1 written after pass 3: carried by its own zero-length span.
    orphans = [s for s in spans if s.name == A.ORPHAN_SPAN]
    assert len(orphans) == 1
    assert orphans[0].attributes[A.PASS_SEQ] == 1
    assert [e.name for e in orphans[0].events] == [A.ALLOC_FAILED_EVENT]
    assert len(spans) == len(passes) + 1
    # Each pass is its own root span.
    assert all(s.parent is None for s in spans)


def test_linger_ends_a_waiting_span_before_late_events(memory):
    provider, exporter = memory
    recs = records()
    sink = make_sink(header(), tracer_provider=provider, environ=ON, configure_sdk=False, linger_s=0)
    sink(recs[:3])  # arrivals and pass 0
    assert exporter.get_finished_spans() == ()
    sink(recs[3:5])  # its alloc events, in a later batch past the linger: pass 0 has ended
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == [A.PASS_SPAN, A.ORPHAN_SPAN]


def test_a_failing_mirror_never_raises_and_stops(memory):
    provider, exporter = memory
    sink = make_sink(header(), tracer_provider=provider, environ=ON, configure_sdk=False)
    broken = records()[2]
    broken.kv = None  # not a schema value: the mapping fails inside the sink
    sink([broken])
    assert sink.failed
    sink(records())  # later batches are ignored, not raised
    sink.close()
    assert exporter.get_finished_spans() == ()


def test_through_the_writer_thread_sink_interface(tmp_path, memory):
    provider, exporter = memory
    hdr = header()
    sink = make_sink(hdr, tracer_provider=provider, environ=ON, configure_sdk=False, linger_s=60)
    writer = WriterThread(tmp_path, "w", lambda part, first: hdr, clock_ns=lambda: 9000,
                          sinks=[sink], flush_interval_s=0.01)
    for record in records():
        writer.submit(record)
    writer.close()
    sink.close()
    assert writer.sink_errors == 0
    with TraceReader(writer.paths[0]) as reader:
        written = list(reader.passes())
    spans = [s for s in exporter.get_finished_spans() if s.name == A.PASS_SPAN]
    assert sorted(s.attributes[A.PASS_SEQ] for s in spans) == [p.seq for p in written]
    assert len(spans) == 4


def test_sdk_set_up_is_asked_for_explicitly():
    assert requested_exporters({}) == []
    assert requested_exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert requested_exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}) == ["otlp"]
    assert requested_exporters({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp"]
    assert requested_exporters({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) == []


_APP = textwrap.dedent(
    """
    import sys
    from opentelemetry import trace
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.export.otel_mirror import make_sink
    if sys.argv[2] == "operator":  # the operator configured tracing first: it must be kept
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        memory = InMemorySpanExporter()
        own = TracerProvider()
        own.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(own)
    with TraceReader(sys.argv[1]) as reader:
        sink = make_sink(reader.header)
        for _, record in reader.records():
            sink([record])
    sink.close()
    if sys.argv[2] == "operator":
        assert trace.get_tracer_provider() is own
        print("operator spans", len(memory.get_finished_spans()))
    trace.get_tracer_provider().shutdown()
    """
)


@pytest.mark.parametrize("mode", ["fresh", "operator"])
def test_sink_configures_the_sdk_from_otel_env_only_without_a_provider(tmp_path, mode):
    path = write_small_trace(tmp_path / "t.trace")
    receiver = OtlpReceiver()
    try:
        env = {
            "PATH": "/usr/bin:/bin",
            "SCHEDTRACE_OTEL": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
            "OTEL_SERVICE_NAME": "sched-test",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
        done = subprocess.run([sys.executable, "-c", _APP, str(path), mode], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        received = receiver.spans()
    finally:
        receiver.close()
    if mode == "operator":
        assert "operator spans 5" in done.stdout
        assert received == []
    else:
        pass_spans = [s for _, s in received if s.name == A.PASS_SPAN]
        assert sorted(attrs_of(s)[A.PASS_SEQ] for s in pass_spans) == [0, 1, 2, 3]
        assert {r["service.name"] for r, _ in received} == {"sched-test"}
        assert set(receiver.paths) == {"/v1/traces"}
