"""Mirror trace records as OpenTelemetry spans, through the OpenTelemetry API only.

One span per pass record (``schedtrace.pass``), from the pass's own time
and duration converted to epoch ns with the header's ``start_wall_ns``,
corrected by the latest ``clock`` record (schedtrace.tracer.export.wallclock).
Failed allocations, exceptions, hook errors, aiter choices and record losses
become events on the span of their pass. Names: tracer/otel_attrs.py and
docs/otel.md.

A pass's events are written *after* its pass record (the allocator runs
once the pass has returned), so the newest pass span stays open until the
next pass record arrives (or, live, for ``linger_s``) and is then ended with
its recorded end time. An event whose span has already ended is carried by a
zero-length ``schedtrace.event`` span naming the pass.

``SpanMirror`` is the pure mapping, shared with ``schedtrace export --format
otlp``. ``make_sink`` wraps it for the recorder's writer thread: it runs
after the file write, never raises into the writer, and the SDK's
BatchSpanProcessor does the exporting off that thread. This module never
configures an SDK itself; see ``make_sink`` for the one opt-in hand-off to
schedtrace.tracer.export.otel_sdk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from schedtrace.tracer.export import otel_attrs as A
from schedtrace.tracer.analysis.pools import limiting_pool, pool_counts
from schedtrace.tracer.contract.names import OTEL_ENV, env_flag, split_error
from schedtrace.tracer.contract.schema import (Aiter, Alloc, Clock, Header, HookError, KvSnapshot, Loss, Pass,
                                               PoolLayout, Record)
from schedtrace.tracer.contract.versions import installed_version
from schedtrace.tracer.export.wallclock import WallClock

_log = logging.getLogger(__name__)

DEFAULT_LINGER_S = 1.0

Annotate = Callable[[Span, Pass, int], None]  # (span, pass, pass end in epoch ns)


def otel_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return env_flag(OTEL_ENV, environ)


def pool_attributes(kv: KvSnapshot, layout: PoolLayout | None) -> dict[str, Any]:
    """The hybrid pools' counts and the limiting pool (none of them on a plain model)."""
    values = ((A.KV_PROTECTED, kv.protected), (A.KV_SWA_FREE, kv.swa_available),
              (A.KV_SWA_EVICTABLE, kv.swa_evictable), (A.KV_SWA_PROTECTED, kv.swa_protected),
              (A.KV_MAMBA_FREE, kv.mamba_available), (A.KV_MAMBA_EVICTABLE, kv.mamba_evictable),
              (A.KV_MAMBA_PROTECTED, kv.mamba_protected))
    attrs: dict[str, Any] = {name: value for name, value in values if value is not None}
    limit = limiting_pool(pool_counts(kv, layout))
    if limit is not None:
        attrs[A.KV_LIMITING_POOL] = limit
    return attrs


def pass_attributes(record: Pass, layout: PoolLayout | None = None) -> dict[str, Any]:
    """Span attributes of a pass record (absent values are left out, as OTel requires);
    ``layout`` (``Header.pools``) sizes the pools for the limiting pool."""
    attrs: dict[str, Any] = {
        A.PASS_SEQ: record.seq,
        A.PASS_REPEAT: record.repeat,
        A.PASS_IDLE_BEFORE: record.idle_before,
        A.PASS_RESULT: A.pass_result(record),
        A.QUEUE_WAITING: len(record.waiting),
        A.BATCH_RUNNING: len(record.running),
        A.KV_FREE: record.kv.available,
        A.KV_EVICTABLE: record.kv.evictable,
        A.REQ_SLOTS_FREE: record.req_slots_free,
        A.CANDIDATES: len(record.candidates),
        A.ADMITTED: len(record.admitted),
        A.ADMITTED_TOKENS: sum(a.extend_len for a in record.admitted),
        A.BATCH_IS_FULL_IN: record.batch_is_full_in,
        A.BATCH_IS_FULL_OUT: record.batch_is_full_out,
    }
    if record.chunked_prefill_size is not None:
        attrs[A.CHUNKED_PREFILL_SIZE] = record.chunked_prefill_size
    if record.chunk is not None:
        if record.chunk.size is not None:
            attrs[A.CHUNK_SIZE] = record.chunk.size
        if record.chunk.budget is not None:
            attrs[A.CHUNK_BUDGET] = record.chunk.budget
    if record.new_chunked_rid is not None:
        attrs[A.NEW_CHUNKED_RID] = record.new_chunked_rid
    attrs.update(pool_attributes(record.kv, layout))
    return attrs


def event_of(record: Record) -> tuple[str, dict[str, Any]] | None:
    """(event name, attributes) for the records that become span events."""
    if type(record) is Alloc:
        if record.ok:
            return None
        return A.ALLOC_FAILED_EVENT, {
            A.PASS_SEQ: record.pass_seq,
            A.ALLOC_OP: record.op,
            A.ALLOC_REQUESTED: record.requested,
            A.ALLOC_FREE: record.available,
            A.ALLOC_EVICTABLE: record.evictable,
        }
    if type(record) is Aiter:
        return A.AITER_EVENT, {
            A.PASS_SEQ: record.pass_seq,
            A.AITER_METHOD: record.method,
            A.AITER_FORWARD_MODE: record.forward_mode,
            A.AITER_SEQ_LENS_SUM: record.seq_lens_sum,
            A.AITER_MAX_CHUNK_CAPACITY: record.max_chunk_capacity,
            A.AITER_IN_PIECEWISE_GRAPH: record.in_piecewise_graph,
            A.AITER_IN_BREAKABLE_GRAPH: record.in_breakable_graph,
        }
    if type(record) is HookError:
        return A.HOOK_ERROR_EVENT, {
            A.HOOK_NAME: record.hook,
            A.EXCEPTION_MESSAGE: record.message,
            A.HOOK_ERROR_COUNT: record.count,
        }
    if type(record) is Loss:
        return A.LOSS_EVENT, {A.LOSS_COUNT: record.count, A.LOSS_REASON: record.reason}
    return None


class SpanMirror:
    """Feeds schema records in file order; emits spans through ``tracer``.

    Not thread-safe: one feeder (the writer thread, or the export loop).
    ``annotate`` may add events to each pass span before it ends (the OTLP
    export adds the replay's divergences there). ``linger_ns``: end a pass
    span that has waited that long (monotonic) for its events; None: wait for
    the next pass or ``close``.
    """

    def __init__(
        self,
        tracer: Tracer,
        header: Header | None = None,
        *,
        annotate: Annotate | None = None,
        linger_ns: int | None = None,
    ) -> None:
        self._tracer = tracer
        self._annotate = annotate
        self._linger_ns = linger_ns
        self._root = otel_context.Context()  # spans are roots, whatever is current
        self._clock: WallClock | None = None
        self._layout: PoolLayout | None = None
        self._static: dict[str, Any] = {}
        self._open: Span | None = None
        self._open_seq = -1
        self._open_end_ns = 0
        self._open_since = 0
        self.spans_started = 0
        if header is not None:
            self.set_header(header)

    def set_header(self, header: Header) -> None:
        self._clock = WallClock.of(header)
        self._layout = header.pools
        self._static = {A.TP_RANK: header.tp_rank}
        if header.dp_rank is not None:
            self._static[A.DP_RANK] = header.dp_rank

    def wall_ns(self, t_ns: int) -> int:
        if self._clock is None:
            # No header seen: anchor the trace clock to now (off by the write latency only).
            self._clock = WallClock(time.time_ns() - t_ns)
        return self._clock.wall_ns(t_ns)

    def feed(self, records: Iterable[Record]) -> None:
        if self._open is not None and self._linger_ns is not None:
            if time.monotonic_ns() - self._open_since >= self._linger_ns:
                self._end_open()
        for record in records:
            kind = type(record)
            if kind is Pass:
                self._end_open()
                self._start_pass(record)
            elif kind is Header:
                self.set_header(record)
            elif kind is Clock:
                if self._clock is None:
                    self._clock = WallClock(record.wall_ns - record.t_ns)
                else:
                    self._clock.observe(record)
            else:
                event = event_of(record)
                if event is not None:
                    self._add_event(record, *event)

    def close(self) -> None:
        """End the span still waiting for events."""
        self._end_open()

    def _start_pass(self, record: Pass) -> None:
        start = self.wall_ns(record.t_ns)
        end = start + max(record.dur_ns, 0)
        attrs = pass_attributes(record, self._layout)
        attrs.update(self._static)
        span = self._tracer.start_span(
            A.PASS_SPAN, context=self._root, attributes=attrs, start_time=start
        )
        self.spans_started += 1
        if record.error is not None:
            kind, message = split_error(record.error)
            span.add_event(
                A.EXCEPTION_EVENT, {A.EXCEPTION_TYPE: kind, A.EXCEPTION_MESSAGE: message}, timestamp=end
            )
            span.set_status(Status(StatusCode.ERROR, record.error))
        if self._annotate is not None:
            self._annotate(span, record, end)
        self._open, self._open_seq, self._open_end_ns = span, record.seq, end
        self._open_since = time.monotonic_ns()

    def _end_open(self) -> None:
        if self._open is not None:
            self._open.end(end_time=self._open_end_ns)
            self._open = None

    def _add_event(self, record: Record, name: str, attrs: dict[str, Any]) -> None:
        at = self.wall_ns(record.t_ns)
        pass_seq = attrs.get(A.PASS_SEQ)
        if self._open is not None and pass_seq in (None, self._open_seq):
            self._open.add_event(name, attrs, timestamp=at)
            return
        # Its pass span has ended (or there was none): a zero-length carrier span.
        carrier_attrs = dict(self._static)
        if pass_seq is not None:
            carrier_attrs[A.PASS_SEQ] = pass_seq
        span = self._tracer.start_span(
            A.ORPHAN_SPAN, context=self._root, attributes=carrier_attrs, start_time=at
        )
        self.spans_started += 1
        span.add_event(name, attrs, timestamp=at)
        span.end(end_time=at)


class OtelSink:
    """The recorder sink: ``sink(batch)`` after each file write, ``sink.close()`` at shutdown.

    Never raises: the first failure is logged and mirroring stops, the trace
    file being the complete record anyway.
    """

    def __init__(
        self,
        header: Header | None,
        tracer_provider: trace.TracerProvider | None,
        *,
        configure_sdk: bool,
        linger_s: float,
    ) -> None:
        self._header = header
        self._provider = tracer_provider
        self._configure_sdk = configure_sdk
        self._linger_ns = int(linger_s * 1e9)
        self._mirror: SpanMirror | None = None
        self._lock = threading.Lock()  # close() may come from another thread (atexit)
        self.failed = False

    def _start(self) -> SpanMirror:
        # Resolved on the first batch, not at plugin load: by then sglang's own
        # --enable-trace set-up (if any) has installed its provider, which wins.
        provider = self._provider
        if provider is None and self._configure_sdk:
            try:
                from schedtrace.tracer.export.otel_sdk import configure_from_env
            except ImportError:  # the SDK is optional; the API alone still works
                pass
            else:
                configure_from_env()
        tracer = trace.get_tracer(A.INSTRUMENTATION_SCOPE, schedtrace_version(), tracer_provider=provider)
        return SpanMirror(tracer, self._header, linger_ns=self._linger_ns)

    def set_header(self, header: Header) -> None:
        """The header of the part being written (a Header record in a batch does the same)."""
        with self._lock:
            self._header = header
            if self._mirror is not None:
                self._mirror.set_header(header)

    def __call__(self, batch: list[Record]) -> None:
        if self.failed:
            return
        with self._lock:
            try:
                if self._mirror is None:
                    self._mirror = self._start()
                self._mirror.feed(batch)
            except Exception:  # mirroring must never break the writer thread
                self.failed = True
                _log.exception("schedtrace: OpenTelemetry mirror failed; mirroring stops (the trace file is unaffected)")

    def close(self) -> None:
        with self._lock:
            if self._mirror is not None and not self.failed:
                try:
                    self._mirror.close()
                except Exception:
                    self.failed = True
                    _log.exception("schedtrace: OpenTelemetry mirror failed on close")


def make_sink(
    header: Header | None = None,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    environ: Mapping[str, str] = os.environ,
    configure_sdk: bool = True,
    linger_s: float = DEFAULT_LINGER_S,
) -> OtelSink | None:
    """The writer-thread sink, or None unless ``SCHEDTRACE_OTEL=1``.

    ``header``: the trace header (its ``start_wall_ns`` anchors span times);
    a Header record seen in a batch also sets it. ``tracer_provider``: use
    this provider instead of the global one (tests). ``configure_sdk``: on
    the first batch, let schedtrace.tracer.export.otel_sdk install an SDK from the ``OTEL_*``
    variables if, and only if, no provider is set yet and an OTLP endpoint or
    ``OTEL_TRACES_EXPORTER`` is given; otherwise spans go to whatever global
    provider the process has (none: the API's no-op).
    """
    if not otel_enabled(environ):
        return None
    return OtelSink(header, tracer_provider, configure_sdk=configure_sdk, linger_s=linger_s)


def schedtrace_version() -> str | None:
    version = installed_version("schedtrace")
    return None if version == "unknown" else version
