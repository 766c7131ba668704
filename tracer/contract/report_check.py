"""Does a replay report belong to the trace it is shown with?

``load_report`` checks a report on its own (size, version, shape); only the
trace can say whether its pass numbers exist. ``check_report`` compares the
two: the trace's fingerprint (when the report carries one) and every pass
number the report names, and the byte offsets of its holes.
"""

from __future__ import annotations

from collections.abc import Iterator

from schedtrace.tracer.contract.errors import ReportMismatchError
from schedtrace.tracer.contract.reader import TraceReader
from schedtrace.tracer.contract.report import Report


def report_passes(report: Report) -> Iterator[tuple[str, int]]:
    """(what, pass seq) for every trace pass the report names (closed-loop runs have their own numbers)."""
    for divergence in report.divergences:
        yield "divergence", divergence.pass_
    for mismatch in report.fidelity.mismatches:
        yield "fidelity mismatch", mismatch.pass_
    for arm, stalls in report.stalls.items():
        for stall in stalls:
            yield f"{arm} stall start", stall.start_pass
            yield f"{arm} stall end", stall.end_pass
    for arm, errors in report.errors.items():
        for error in errors:
            yield f"{arm} error", error.pass_
    for region in report.holes.regions:
        for seq in (region.first_pass, region.last_pass):
            if seq is not None:
                yield f"unreadable region at offset {region.start}", seq
    for loss in report.holes.losses:
        if loss.after_pass is not None:
            yield f"loss record at offset {loss.offset}", loss.after_pass


def report_offsets(report: Report) -> Iterator[tuple[str, int]]:
    """(what, byte offset) for every place in the trace file the report's holes name."""
    for region in report.holes.regions:
        yield "unreadable region start", region.start
        yield "unreadable region end", region.end
    for loss in report.holes.losses:
        yield "loss record", loss.offset


def check_report(report: Report, reader: TraceReader, report_path: str) -> None:
    """Raise ``ReportMismatchError`` if ``report`` cannot be about the trace ``reader`` reads.

    A report names passes by seq; an event before the first pass names the
    pass before it (``first_pass - 1``), so that is allowed too.
    """
    carried = getattr(report, "trace_fingerprint", "")  # the field the replay engine stores
    if carried and carried != reader.fingerprint():
        raise ReportMismatchError(report_path, f"made from another trace, or from {reader.path} before it changed "
                                  "(the trace fingerprints differ)")
    first, count = reader.header.first_pass, reader.pass_count
    last = first + count - 1
    if report.passes + report.holes.passes_lost > count:
        lost = f" and lost {report.holes.passes_lost}" if report.holes.passes_lost else ""
        raise ReportMismatchError(report_path, f"replayed {report.passes} passes{lost}; {reader.path} has {count}")
    for what, offset in report_offsets(report):
        if not 0 <= offset <= reader.file_size:
            raise ReportMismatchError(report_path, f"{what} at offset {offset} is outside {reader.path} "
                                      f"({reader.file_size:,} bytes)")
    for what, seq in report_passes(report):
        if not first - 1 <= seq <= last:
            raise ReportMismatchError(report_path, f"{what} at pass {seq} is outside the passes of {reader.path} "
                                      f"({first}–{last})")
    if report.closed_loop is not None and not 0 <= report.closed_loop.from_pass < max(count, 1):
        raise ReportMismatchError(report_path, f"closed loop from pass {report.closed_loop.from_pass} is outside "
                                  f"the {count} passes of {reader.path}")
