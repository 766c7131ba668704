"""OpenTelemetry SDK set-up for the application side (server processes, the export command).

The library (schedtrace.tracer.export.otel_mirror) only uses the API. This module is the one
place that builds SDK objects, from the standard ``OTEL_*`` variables:

* ``configure_from_env()``: install a global TracerProvider with a
  BatchSpanProcessor and an OTLP/HTTP (protobuf) exporter, *only* when the
  environment asks for one (``OTEL_TRACES_EXPORTER`` or an OTLP endpoint is
  set) and no provider is installed yet, so an operator's own set-up (or
  sglang's ``--enable-trace``) always wins. The recorder's sink calls it on
  its first batch when ``SCHEDTRACE_OTEL=1``.
* ``make_resource()``: the Resource both use (``service.name`` defaults to
  ``schedtrace``; ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` win).

The exporter, endpoint, headers, timeout, compression and the batch
processor's ``OTEL_BSP_*`` limits are all read by the SDK itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

_log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "schedtrace"
SUPPORTED_PROTOCOL = "http/protobuf"
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def make_resource(extra: Mapping[str, Any] | None = None) -> Resource:
    """The SDK's env-derived Resource, with a ``schedtrace`` service name by default."""
    resource = Resource.create(dict(extra or {}))
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def provider_is_set() -> bool:
    """True once any real TracerProvider (SDK or vendor) is installed globally."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def requested_exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Exporter names the environment explicitly asks for ([] = leave tracing alone)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names and any(environ.get(var) for var in _ENDPOINT_VARS):
        names = ["otlp"]  # an endpoint alone means the spec's default exporter
    return [n for n in names if n != "none"]


def make_exporters(names: list[str], environ: Mapping[str, str] = os.environ) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            protocol = next((environ[v] for v in _PROTOCOL_VARS if environ.get(v)), SUPPORTED_PROTOCOL)
            if protocol.strip() != SUPPORTED_PROTOCOL:
                _log.warning("schedtrace: OTLP protocol %r is not supported, only %s; no spans exported",
                             protocol, SUPPORTED_PROTOCOL)
                continue
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())  # endpoint, headers, timeout... from OTEL_* vars
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            _log.warning("schedtrace: OTEL_TRACES_EXPORTER=%s is not supported (otlp, console); ignored", name)
    return exporters


def configure_from_env(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """Install the global SDK provider the environment asks for; None when it did not.

    Idempotent and safe to race: OpenTelemetry sets the global provider at
    most once, and an existing provider is never replaced.
    """
    if provider_is_set():
        return None
    exporters = make_exporters(requested_exporters(environ), environ)
    if not exporters:
        return None
    provider = TracerProvider(resource=make_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* limits
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # another thread won the race
        provider.shutdown()
        return None
    return provider
