"""Exporters from a recorded trace to other tools (``schedtrace export``).

* ``chrome``: Trace Event Format JSON that opens in Perfetto UI
  (tracer/export/chrome.py), written as a stream.
* ``otlp``: the passes as OpenTelemetry spans over OTLP/HTTP protobuf
  (tracer/export/otlp.py), with the same names as the live mirror.

Both read a trace through the ``TraceReader`` interface (a file, or a rank's
parts as one ``schedtrace.tracer.contract.traceset.RankTrace``), place it on
the wall clock with ``wallclock``, and read the replay report only through
``schedtrace.tracer.contract.report.load_report``.
"""
