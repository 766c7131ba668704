"""Trace Event Format JSON (Chrome tracing / Perfetto UI), streamed record by record.

One process per trace (the scheduler), with these tracks:

* thread "scheduling passes": one ``X`` slice per pass record, named by its
  result (admitted / chunk / rejected / error);
* counters ``C``: queue depth, running size, KV free, KV evictable (emitted
  when they change);
* thread "events": ``i`` instants for failed allocations, exceptions, hook
  errors and record losses;
* thread "stalls": ``i`` at the onset of each stall, from the replay report
  when given, else the stalls in the recorded decisions (``schedtrace.tracer.analysis.stalls``);
* thread "replay divergences" (with a report): one ``i`` per divergence;
* per request, nestable async slices ``b``/``e`` (category ``request``, id =
  rid): the request from arrival to finish, with ``queued`` (arrival to
  admission) and ``running`` (admission to finish or retraction) inside.

Timestamps are µs on the trace's monotonic clock (``t_ns / 1000``). Memory
is bounded by the open requests and the report, never by the trace length.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Divergence, Report, Stall
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.names import split_error
from schedtrace.tracer.export.otel_mirror import pass_result
from schedtrace.tracer.contract.schema import Abort, Alloc, Arrival, Finish, Header, HookError, Loss, Pass, Retract

PID = 1
TID_PASSES, TID_EVENTS, TID_STALLS, TID_DIVERGENCES = 1, 2, 3, 4
THREAD_NAMES = {
    TID_PASSES: "scheduling passes",
    TID_EVENTS: "events",
    TID_STALLS: "stalls",
    TID_DIVERGENCES: "replay divergences",
}
COUNTERS = ("queue depth", "running", "KV free", "KV evictable")
REQUEST_CATEGORY = "request"


Event = dict[str, Any]


def us(t_ns: int) -> float:
    return t_ns / 1000


def metadata_events(header: Header) -> list[Event]:
    rank = f"tp{header.tp_rank}" + (f" dp{header.dp_rank}" if header.dp_rank is not None else "")
    events: list[Event] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0,
         "args": {"name": f"sglang scheduler {header.host} pid {header.pid} {rank}"}},
        {"ph": "M", "name": "process_labels", "pid": PID, "tid": 0,
         "args": {"labels": f"sglang {header.sglang_version}, {header.server_args.schedule_policy}"}},
    ]
    for tid, name in THREAD_NAMES.items():
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    return events


def instant(name: str, tid: int, t_ns: int, args: dict[str, Any]) -> Event:
    return {"ph": "i", "s": "t", "name": name, "pid": PID, "tid": tid, "ts": us(t_ns), "args": args}


def pass_event(record: Pass) -> Event:
    args: dict[str, Any] = {
        "seq": record.seq,
        "repeat": record.repeat,
        "idle_before": record.idle_before,
        "waiting": len(record.waiting),
        "running": len(record.running),
        "kv_free": record.kv.available,
        "kv_evictable": record.kv.evictable,
        "req_slots_free": record.req_slots_free,
        "candidates": len(record.candidates),
        "admitted": [f"{a.rid}:{a.extend_len}" for a in record.admitted],
        "batch_is_full_in": record.batch_is_full_in,
        "batch_is_full_out": record.batch_is_full_out,
    }
    if record.chunk is not None:
        args["chunk"] = {"rid": record.chunk.rid, "budget": record.chunk.budget, "size": record.chunk.size}
    if record.new_chunked_rid is not None:
        args["new_chunked_rid"] = record.new_chunked_rid
    if record.error is not None:
        args["error"] = record.error
    return {"ph": "X", "name": pass_result(record), "pid": PID, "tid": TID_PASSES,
            "ts": us(record.t_ns), "dur": us(max(record.dur_ns, 0)), "args": args}


@dataclass
class _Requests:
    """Async slices per request; holds only requests still open."""

    state: dict[str, str] = field(default_factory=dict)  # rid -> "queued" | "running"

    def _slice(self, ph: str, name: str, rid: str, t_ns: int, args: dict[str, Any] | None = None) -> Event:
        event: Event = {"ph": ph, "cat": REQUEST_CATEGORY, "name": name, "id": rid, "pid": PID, "tid": TID_PASSES,
                        "ts": us(t_ns)}
        if args:
            event["args"] = args
        return event

    def arrive(self, record: Arrival) -> Iterator[Event]:
        if record.rid in self.state:
            return
        self.state[record.rid] = "queued"
        yield self._slice("b", record.rid, record.rid, record.t_ns,
                          {"input_len": record.input_len, "max_new_tokens": record.max_new_tokens})
        yield self._slice("b", "queued", record.rid, record.t_ns)

    def admit(self, rid: str, t_ns: int) -> Iterator[Event]:
        if self.state.get(rid) != "queued":
            return
        self.state[rid] = "running"
        yield self._slice("e", "queued", rid, t_ns)
        yield self._slice("b", "running", rid, t_ns)

    def retract(self, record: Retract) -> Iterator[Event]:
        if self.state.get(record.rid) != "running":
            return
        self.state[record.rid] = "queued"
        yield self._slice("e", "running", record.rid, record.t_ns, {"retracted_at_output_len": record.output_len})
        yield self._slice("b", "queued", record.rid, record.t_ns)

    def end(self, rid: str, t_ns: int, args: dict[str, Any]) -> Iterator[Event]:
        inner = self.state.pop(rid, None)
        if inner is None:
            return
        yield self._slice("e", inner, rid, t_ns)
        yield self._slice("e", rid, rid, t_ns, args)

    def close_all(self, t_ns: int) -> Iterator[Event]:
        for rid in list(self.state):
            yield from self.end(rid, t_ns, {"unfinished": True})


class _StallRuns:
    """Stalls in what the recording decided (``schedtrace.tracer.analysis.stalls``), for traces without a report."""

    def __init__(self, threshold: int, header: Header) -> None:
        self.scanner = StallScanner(threshold, header)
        self.onset_ns = 0  # t_ns of the open run's first pass
        self.reported = 0

    def feed(self, record: Pass) -> Iterator[Event]:
        onset_ns = self.onset_ns  # a run this record closes started then
        if self.scanner.feed_pass(record, recorded_decision(record)) and self.scanner.open_run_start == record.seq:
            self.onset_ns = record.t_ns
        yield from self._new_stalls(onset_ns)

    def flush(self) -> Iterator[Event]:
        self.scanner.finish()
        yield from self._new_stalls(self.onset_ns)

    def _new_stalls(self, onset_ns: int) -> Iterator[Event]:
        for stall in self.scanner.stalls[self.reported :]:
            yield instant("stall", TID_STALLS, onset_ns, {
                "source": "the recorded decisions", "start_pass": stall.start_pass, "end_pass": stall.end_pass,
                "passes": stall.passes, "head_rid": stall.head_rid,
            })
        self.reported = len(self.scanner.stalls)


def divergence_event(div: Divergence) -> Event:
    return instant("divergence: " + ", ".join(div.kinds), TID_DIVERGENCES, div.t_ns, {
        "pass": div.pass_, "kinds": div.kinds, "fixes": div.fixes,
        "old": msgspec.to_builtins(div.old), "new": msgspec.to_builtins(div.new),
    })


def stall_event(arm: str, stall: Stall, t_ns: int) -> Event:
    return instant(f"stall ({arm})", TID_STALLS, t_ns, {
        "source": "replay report", "arm": arm, "start_pass": stall.start_pass, "end_pass": stall.end_pass,
        "passes": stall.passes, "head_rid": stall.head_rid,
    })


@dataclass
class ChromeStats:
    passes: int = 0
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by phase


def trace_events(
    reader: TraceReader, report: Report | None = None, *, stall_passes: int = DEFAULT_STALL_PASSES
) -> Iterator[Event]:
    """Every Trace Event of the trace, in record order."""
    yield from metadata_events(reader.header)
    divergences: dict[int, list[Divergence]] = defaultdict(list)
    stalls: dict[int, list[tuple[str, Stall]]] = defaultdict(list)
    if report is not None:
        for div in report.divergences:
            divergences[div.pass_].append(div)
        for arm, arm_stalls in sorted(report.stalls.items()):
            for stall in arm_stalls:
                stalls[stall.start_pass].append((arm, stall))
    runs = _StallRuns(stall_passes, reader.header) if report is None else None
    requests = _Requests()
    counters: dict[str, int] = {}
    last_t = 0
    for _, record in reader.records():
        kind = type(record)
        last_t = max(last_t, getattr(record, "t_ns", 0))
        if kind is Pass:
            yield pass_event(record)
            for name, value in zip(COUNTERS, (len(record.waiting), len(record.running),
                                              record.kv.available, record.kv.evictable)):
                if counters.get(name) != value:
                    counters[name] = value
                    yield {"ph": "C", "name": name, "pid": PID, "tid": TID_PASSES, "ts": us(record.t_ns),
                           "args": {"value": value}}
            end_ns = record.t_ns + max(record.dur_ns, 0)
            last_t = max(last_t, end_ns)
            if record.error is not None:
                kind_, message = split_error(record.error)
                yield instant("exception", TID_EVENTS, end_ns, {"pass": record.seq, "type": kind_, "message": message})
            for admitted in record.admitted:
                yield from requests.admit(admitted.rid, end_ns)
            if runs is not None:
                yield from runs.feed(record)
            for arm, stall in stalls.pop(record.seq, ()):
                yield stall_event(arm, stall, record.t_ns)
            for div in divergences.pop(record.seq, ()):
                yield divergence_event(div)
        elif kind is Arrival:
            yield from requests.arrive(record)
        elif kind is Finish:
            yield from requests.end(record.rid, record.t_ns, {"output_len": record.output_len, "reason": record.reason})
        elif kind is Abort:
            yield from requests.end(record.rid, record.t_ns, {"reason": "abort"})
        elif kind is Retract:
            yield from requests.retract(record)
        elif kind is Alloc:
            if not record.ok:
                yield instant("alloc failed", TID_EVENTS, record.t_ns, {
                    "pass": record.pass_seq, "op": record.op, "requested": record.requested,
                    "free": record.available, "evictable": record.evictable,
                })
        elif kind is HookError:
            yield instant("hook error", TID_EVENTS, record.t_ns,
                          {"hook": record.hook, "message": record.message, "count": record.count})
        elif kind is Loss:
            yield instant("records lost", TID_EVENTS, record.t_ns, {"count": record.count, "reason": record.reason})
    if runs is not None:
        yield from runs.flush()
    # Report entries for passes the trace does not hold (a truncated file) are dropped on purpose.
    yield from requests.close_all(last_t)


_encoder = msgspec.json.Encoder()


def write_events(events: Iterable[Event], out: IO[bytes], *, other_data: dict[str, Any] | None = None) -> ChromeStats:
    """Stream ``events`` as one Trace Event Format JSON object into ``out``."""
    stats = ChromeStats()
    out.write(b'{"displayTimeUnit":"ms","otherData":')
    out.write(_encoder.encode(other_data or {}))
    out.write(b',"traceEvents":[\n')
    buffer = bytearray()
    first = True
    for event in events:
        if not first:
            buffer += b",\n"
        first = False
        _encoder.encode_into(event, buffer, -1)
        stats.events[event["ph"]] += 1
        if event["ph"] == "X":
            stats.passes += 1
        if len(buffer) > 1 << 16:
            out.write(buffer)
            buffer.clear()
    out.write(buffer)
    out.write(b"\n]}\n")
    return stats


def export_chrome(
    reader: TraceReader, out: IO[bytes], report: Report | None = None, *, stall_passes: int = DEFAULT_STALL_PASSES
) -> ChromeStats:
    header = reader.header
    other = {"schedtrace_trace": reader.path, "sglang_version": header.sglang_version,
             "start_wall_ns": header.start_wall_ns, "clock": "monotonic since the trace start"}
    if report is not None:
        other["replay"] = {"old": report.old, "new": report.new}
    return write_events(trace_events(reader, report, stall_passes=stall_passes), out, other_data=other)
