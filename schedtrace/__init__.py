"""schedtrace: a trace-and-replay debugger for the SGLang scheduler.

The Python API, for notebooks and scripts (docs/api.md)::

    import schedtrace

    with schedtrace.open_trace("traces/kv-pressure-lpm-24k.trace") as trace:
        for p in trace.passes():
            ...
    report = schedtrace.load_report("out/replay.json")

Every name is imported on first use, so ``import schedtrace`` stays cheap and
needs only the base dependencies (msgpack, msgspec, xxhash): the recorder
plugin installs without sglang, and none of these names imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_CONTRACT = "schedtrace.tracer.contract"
# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("open_trace", "Trace", "open_traceset", "TraceSet"), f"{_CONTRACT}.opener"),
    "RankTrace": f"{_CONTRACT}.traceset",
    "TraceReader": f"{_CONTRACT}.reader",
    **dict.fromkeys(("Report", "Decision", "Divergence", "Mismatch", "Fidelity", "Stall", "ArmError",
                     "ArmOutcome", "SelfCheck", "ClosedLoop", "DamagedRegion", "LostRecords", "Holes",
                     "SweepReport", "SweepCell", "SweepArm", "BisectReport", "StallFinding", "RanksReport",
                     "CheckReport", "CheckRow", "load_report", "dump_report"), f"{_CONTRACT}.report"),
    **dict.fromkeys(("Header", "Pass"), f"{_CONTRACT}.schema"),
    **dict.fromkeys(("SchedtraceError", "TraceError", "TraceNotFoundError", "TraceFormatError",
                     "TraceDamagedError", "TraceSetError", "TraceVersionError", "ReportMismatchError",
                     "UsageError"), f"{_CONTRACT}.errors"),
    "summarize": "schedtrace.tracer.analysis.summary",
    "STALL_RULE": "schedtrace.tracer.analysis.stalls",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from schedtrace.tracer.analysis.stalls import STALL_RULE
    from schedtrace.tracer.analysis.summary import summarize
    from schedtrace.tracer.contract.errors import (ReportMismatchError, SchedtraceError, TraceDamagedError,
                                                   TraceError, TraceFormatError, TraceNotFoundError,
                                                   TraceSetError, TraceVersionError, UsageError)
    from schedtrace.tracer.contract.opener import Trace, TraceSet, open_trace, open_traceset
    from schedtrace.tracer.contract.reader import TraceReader
    from schedtrace.tracer.contract.report import (ArmError, ArmOutcome, BisectReport, CheckReport, CheckRow,
                                                   ClosedLoop, DamagedRegion, Decision, Divergence, Fidelity,
                                                   Holes, LostRecords, Mismatch, RanksReport, Report, SelfCheck,
                                                   Stall, StallFinding, SweepArm, SweepCell, SweepReport,
                                                   dump_report, load_report)
    from schedtrace.tracer.contract.schema import Header, Pass
    from schedtrace.tracer.contract.traceset import RankTrace


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'schedtrace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
