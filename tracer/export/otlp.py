"""Send a recorded trace as OpenTelemetry spans over OTLP/HTTP protobuf.

The spans are the live mirror's (schedtrace.tracer.export.otel_mirror.SpanMirror, same
``schedtrace.*`` names) with the trace's own timestamps; with a replay report
each pass span also carries its ``schedtrace.divergence`` and
``schedtrace.stall`` events. The SDK's OTLPSpanExporter does the encoding and
the retries (exponential backoff inside one total ``timeout_s`` deadline per
batch); batches are sent synchronously so a failure stops the export at once
with ``EndpointUnreachableError`` (or ``ExportError`` for an HTTP refusal)
instead of being dropped in the background.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult, SpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Span

from schedtrace.tracer.contract.report import Divergence, Report, Stall
from schedtrace.tracer.export import otel_attrs as A
from schedtrace.tracer.contract.errors import EndpointUnreachableError, ExportError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.traceset import RankTrace
from schedtrace.tracer.export.otel_mirror import SpanMirror, schedtrace_version
from schedtrace.tracer.export.otel_sdk import make_resource
from schedtrace.tracer.contract.schema import Pass

DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_BATCH = 512
_ERRNO = re.compile(r"\[Errno -?\d+\] [^\"')]+")
_FEED_CHUNK = 256  # records fed to the mirror between checks of the span buffer


def resolve_endpoint(endpoint: str | None, environ: dict[str, str] | None = None) -> str:
    """--endpoint, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces.

    A URL with no path (``http://collector:4318``) gets ``/v1/traces``, as a
    base endpoint does in the OTLP spec.
    """
    env = os.environ if environ is None else environ
    if not endpoint:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or ""
        if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + TRACES_PATH
    if not endpoint:
        return DEFAULT_ENDPOINT
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--endpoint {endpoint!r}: expected an http:// or https:// URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path=TRACES_PATH)
    return urlunsplit(parts)


class _Collect(SpanProcessor):
    """Keeps ended spans until the export loop sends them."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class _ExporterLog(logging.Handler):
    """Captures the OTLP exporter's own log lines (the CLI reports one line instead)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def status_code(self) -> int | None:
        for record in self.records:
            if "batch code" in str(record.msg) and isinstance(record.args, tuple) and len(record.args) >= 2:
                code = record.args[1]
                if isinstance(code, int):
                    return code
        return None

    def attempts(self) -> int:
        """Requests made: one per logged retry, plus the last one."""
        return 1 + sum(1 for r in self.records if str(r.msg).startswith("Transient error"))

    def first_reason(self) -> str | None:
        for record in self.records:
            if record.levelno >= logging.WARNING:
                message = record.getMessage()
                errno = _ERRNO.search(message)
                return errno.group(0) if errno else message.splitlines()[0][:160]
        return None


@contextmanager
def _captured_exporter_log() -> Iterator[_ExporterLog]:
    logger = logging.getLogger("opentelemetry.exporter")
    handler = _ExporterLog()
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


@dataclass
class OtlpStats:
    spans: int = 0
    pass_spans: int = 0
    batches: int = 0
    divergence_events: int = 0
    stall_events: int = 0


class _Annotator:
    """Adds the report's divergences and stall onsets to their pass spans."""

    def __init__(self, report: Report, stats: OtlpStats) -> None:
        self.mirror: SpanMirror | None = None
        self.stats = stats
        self.old, self.new = report.old, report.new
        self.divergences: dict[int, list[Divergence]] = defaultdict(list)
        for div in report.divergences:
            self.divergences[div.pass_].append(div)
        self.stalls: dict[int, list[tuple[str, Stall]]] = defaultdict(list)
        for arm, stalls in sorted(report.stalls.items()):
            for stall in stalls:
                self.stalls[stall.start_pass].append((arm, stall))

    def __call__(self, span: Span, record: Pass, end_ns: int) -> None:
        assert self.mirror is not None
        for div in self.divergences.pop(record.seq, ()):
            span.add_event(A.DIVERGENCE_EVENT, {
                A.PASS_SEQ: div.pass_,
                A.DIVERGENCE_KINDS: div.kinds,
                A.DIVERGENCE_FIXES: div.fixes,
                A.DIVERGENCE_OLD_ARM: self.old,
                A.DIVERGENCE_NEW_ARM: self.new,
                A.DIVERGENCE_OLD_ADMITTED: len(div.old.admitted),
                A.DIVERGENCE_NEW_ADMITTED: len(div.new.admitted),
            }, timestamp=self.mirror.wall_ns(div.t_ns))
            self.stats.divergence_events += 1
        for arm, stall in self.stalls.pop(record.seq, ()):
            attrs = {A.STALL_ARM: arm, A.STALL_PASSES: stall.passes, A.STALL_END_PASS: stall.end_pass}
            if stall.head_rid is not None:
                attrs[A.STALL_HEAD_RID] = stall.head_rid
            span.add_event(A.STALL_EVENT, attrs, timestamp=self.mirror.wall_ns(record.t_ns))
            self.stats.stall_events += 1


def export_otlp(
    reader: TraceReader | RankTrace,
    endpoint: str,
    report: Report | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    batch_size: int = DEFAULT_BATCH,
    exporter: SpanExporter | None = None,
) -> OtlpStats:
    """Stream every pass of ``reader`` (a file or a rank's parts) to ``endpoint``; raise on the first
    batch that fails."""
    header = reader.header
    stats = OtlpStats()
    collect = _Collect()
    provider = TracerProvider(
        sampler=ALWAYS_ON,
        resource=make_resource({"host.name": header.host, "process.pid": header.pid}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(collect)
    tracer = provider.get_tracer(A.INSTRUMENTATION_SCOPE, schedtrace_version())
    annotate = _Annotator(report, stats) if report is not None else None
    mirror = SpanMirror(tracer, header, annotate=annotate)
    if annotate is not None:
        annotate.mirror = mirror
    exporter = exporter or OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)

    def send(final: bool) -> None:
        while len(collect.spans) >= batch_size or (final and collect.spans):
            batch, collect.spans = collect.spans[:batch_size], collect.spans[batch_size:]
            started = time.monotonic()
            with _captured_exporter_log() as log:
                result = exporter.export(batch)
            if result is not SpanExportResult.SUCCESS:
                _fail(endpoint, stats, log, time.monotonic() - started)
            stats.batches += 1
            stats.spans += len(batch)
            stats.pass_spans += sum(1 for s in batch if s.name == A.PASS_SPAN)

    try:
        chunk = []
        for _, record in reader.records():
            chunk.append(record)
            if len(chunk) >= _FEED_CHUNK:
                mirror.feed(chunk)
                chunk.clear()
                send(final=False)
        mirror.feed(chunk)
        mirror.close()
        send(final=True)
    finally:
        exporter.shutdown()
        provider.shutdown()
    return stats


def _fail(endpoint: str, stats: OtlpStats, log: _ExporterLog, elapsed_s: float) -> None:
    sent = f"{stats.spans} spans were delivered before this batch"
    code = log.status_code()
    if code is not None:
        raise ExportError(f"{endpoint} refused the spans with HTTP {code}; {sent}")
    reason = log.first_reason() or "no response"
    raise EndpointUnreachableError(
        f"{endpoint} unreachable ({reason}): gave up after {log.attempts()} attempts in {elapsed_s:.1f}s; {sent}"
    )
