"""What one trace file holds, and what looks wrong: the data behind ``schedtrace info``.

``summarize`` is pure over a ``TraceReader`` and returns plain JSON-ready
data (``schedtrace info --json``); the CLI only renders it.

Anomalies:

* failed allocation: an ``alloc`` record with ``ok`` false;
* exception: a pass with ``error`` set, or a ``hook_error`` record;
* stall: at least ``stall_passes`` consecutive passes (repeats counted) that
  admitted nothing and ran no chunk although a request slot was free and the
  head of the waiting queue fit in free + evictable KV
  (``schedtrace.tracer.analysis.stalls`` holds the one definition).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.report import Stall
from schedtrace.tracer.contract.schema import Alloc, HookError, Idle, Loss, Pass

MAX_LISTED: Final = 20  # anomalies listed per kind (all are counted)


def stall_row(reader: TraceReader, stall: Stall) -> dict[str, Any]:
    """One stall with the time and free KV at its onset."""
    onset = reader.pass_at(stall.start_pass - reader.header.first_pass)
    return {
        "first_pass": stall.start_pass, "passes": stall.passes, "t_ns": onset.t_ns,
        "head_rid": stall.head_rid, "kv_free": onset.kv.available + onset.kv.evictable,
    }


def header_facts(reader: TraceReader) -> dict[str, Any]:
    header = reader.header
    args = header.server_args
    return {
        "model": args.model_path,
        "sglang_version": header.sglang_version,
        "schedtrace_version": header.schedtrace_version,
        "host": header.host,
        "pid": header.pid,
        "tp_rank": header.tp_rank,
        "dp_rank": header.dp_rank,
        "part": header.part,
        "first_pass": header.first_pass,
        "max_req_slots": header.max_req_slots,
        "is_hybrid_swa": header.is_hybrid_swa,
        "is_hybrid_mamba": header.is_hybrid_mamba,
        "server_args": {f: getattr(args, f) for f in args.__struct_fields__},
    }


class _Anomalies:
    """Counts every anomaly and keeps the first ``MAX_LISTED`` of each kind."""

    def __init__(self) -> None:
        self.failed_allocs: list[dict[str, Any]] = []
        self.failed_alloc_count = 0
        self.exceptions: list[dict[str, Any]] = []
        self.exception_count = 0

    def exception(self, row: dict[str, Any]) -> None:
        self.exception_count += 1
        if len(self.exceptions) < MAX_LISTED:
            self.exceptions.append(row)

    def failed_alloc(self, row: dict[str, Any]) -> None:
        self.failed_alloc_count += 1
        if len(self.failed_allocs) < MAX_LISTED:
            self.failed_allocs.append(row)


def summarize(reader: TraceReader, stall_passes: int = DEFAULT_STALL_PASSES) -> dict[str, Any]:
    """Header, counts, idle passes, losses, truncation and anomalies of one trace."""
    tags: Counter[str] = Counter()
    passes = folded = idle = lost = 0
    last_t = 0
    anomalies = _Anomalies()
    scanner = StallScanner(stall_passes, reader.header)

    for offset, record in reader.records():
        tags[record.__struct_config__.tag] += 1
        last_t = max(last_t, getattr(record, "t_ns", 0))
        kind = type(record)
        if kind is Pass:
            passes += record.repeat
            folded += record.repeat - 1
            if record.error is not None:
                anomalies.exception({"kind": "pass", "seq": record.seq, "offset": offset, "message": record.error})
            scanner.feed_pass(record, recorded_decision(record))
        elif kind is Idle:
            idle += record.count
        elif kind is Loss:
            lost += record.count
        elif kind is Alloc and not record.ok:
            anomalies.failed_alloc({
                "offset": offset, "pass_seq": record.pass_seq, "op": record.op,
                "requested": record.requested, "available": record.available,
                "evictable": record.evictable,
            })
        elif kind is HookError:
            anomalies.exception({"kind": "hook", "hook": record.hook, "offset": offset,
                                 "message": record.message, "count": record.count})
    stalls = [stall_row(reader, stall) for stall in scanner.finish()]
    tags.pop("header", None)
    return {
        "file": reader.path,
        "header": header_facts(reader),
        "closed_cleanly": reader.closed_cleanly,
        "truncated_at": reader.truncated_at,
        "file_size": reader.file_size,
        "pass_records": tags.get("pass", 0),
        "passes": passes,
        "folded_passes": folded,
        "idle_passes": idle,
        "events": {k: v for k, v in sorted(tags.items()) if k != "pass"},
        "requests": tags.get("arrive", 0),
        "duration_ns": last_t,
        "lost": lost,
        "unknown_records": dict(sorted(reader.unknown_records.items())),
        "anomalies": {
            "failed_allocs": anomalies.failed_alloc_count,
            "failed_alloc_list": anomalies.failed_allocs,
            "exceptions": anomalies.exception_count,
            "exception_list": anomalies.exceptions,
            "stall_passes": stall_passes,
            "stalls_while_kv_free": stalls,
        },
    }
