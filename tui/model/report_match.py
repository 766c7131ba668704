"""Does the replay report shown belong to the trace shown? Each doubt, in one line.

A report that carries the trace's fingerprint (``Report.trace_fingerprint``)
is this trace's when it matches, whatever the file is called now. Otherwise
``report_check.check_report`` (the fingerprint, and every pass number the
report names) has the first word, and the report's trace name and pass count
are compared too: another trace's report can have numbers that happen to fit.
"""

from __future__ import annotations

from pathlib import Path

from schedtrace.tracer.contract.errors import ReportMismatchError
from schedtrace.tracer.contract.reader import TraceReader
from schedtrace.tracer.contract.report import Report
from schedtrace.tracer.contract.report_check import check_report


def report_doubts(report: Report, reader: TraceReader) -> list[str]:
    """Why ``report`` may not be about the trace ``reader`` reads (empty: it is, as far as can be told)."""
    if report.trace_fingerprint and report.trace_fingerprint == reader.fingerprint():
        return []
    doubts = []
    try:
        check_report(report, reader, "the report")
    except ReportMismatchError as exc:
        doubts.append(str(exc).removeprefix("the report: "))
    named, shown = Path(report.trace).name, Path(reader.path).name
    if named != shown:
        doubts.append(f"it was made from {named}, not {shown}")
    count = reader.pass_count
    if report.passes < count:  # more than the trace has: check_report said so
        doubts.append(f"it replayed {report.passes:,} passes; this trace has {count:,}")
    return doubts
