"""Trace Event Format JSON (Chrome tracing / Perfetto UI), streamed record by record.

One process per rank (each a scheduler), on one timeline, with these tracks:

* thread "scheduling passes": one ``X`` slice per pass record, named by its
  result (admitted / chunk / rejected / error);
* counters ``C``: queue depth, running size, KV free, KV evictable, and on a
  hybrid model SWA free/evictable and mamba free/evictable (emitted when
  they change);
* thread "events": ``i`` instants for failed allocations, exceptions, hook
  errors and record losses;
* thread "stalls": ``i`` at the onset of each stall, from the replay report
  when given, else the stalls in the recorded decisions (``schedtrace.tracer.analysis.stalls``);
* thread "replay divergences" (with a report): one ``i`` per divergence;
* per request, nestable async slices ``b``/``e`` (category ``request``, id =
  rid): the request from arrival to finish, with ``queued`` (arrival to
  admission) and ``running`` (admission to finish or retraction) inside.

Timestamps are µs of wall time since the run's start (the earliest rank's
``start_wall_ns``): each rank's ``t_ns`` placed on the wall clock by its
header and its latest ``clock`` record (``wallclock``). One rank without
clock records: ``t_ns / 1000``. Several ranks are merged by timestamp. Memory
is bounded by the open requests, the report and one event per rank, never
by the trace length.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import msgspec

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.pools import limiting_pool, pool_counts
from schedtrace.tracer.contract.report import Divergence, Report, Stall
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.names import split_error
from schedtrace.tracer.contract.rank_keys import rank_label
from schedtrace.tracer.export.otel_attrs import pass_result
from schedtrace.tracer.export.wallclock import WallClock
from schedtrace.tracer.contract.schema import (Abort, Alloc, Arrival, Clock, Finish, Header, HookError, Loss, Pass,
                                               PoolLayout, Record, Retract)

PID = 1
TID_PASSES, TID_EVENTS, TID_STALLS, TID_DIVERGENCES = 1, 2, 3, 4
THREAD_NAMES = {
    TID_PASSES: "scheduling passes",
    TID_EVENTS: "events",
    TID_STALLS: "stalls",
    TID_DIVERGENCES: "replay divergences",
}
# The hybrid counters are emitted only where the pass recorded that pool.
COUNTERS = ("queue depth", "running", "KV free", "KV evictable", "SWA free", "SWA evictable", "mamba free",
            "mamba evictable")
REQUEST_CATEGORY = "request"


Event = dict[str, Any]


class Reader(Protocol):
    """What the export reads: a ``TraceReader`` or a ``RankTrace``."""

    path: str
    header: Header

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]: ...


@dataclass
class Track:
    """Where one rank's events go: its process, and its place on the shared timeline."""

    pid: int
    clock: WallClock
    origin_ns: int  # the wall time of ts 0
    scope: str = ""  # prefixes request ids, which repeat on every rank

    @classmethod
    def alone(cls, header: Header) -> Track:
        return cls(PID, WallClock.of(header), header.start_wall_ns)

    def ts(self, t_ns: int) -> float:
        """µs since the origin, on the wall clock."""
        return (self.clock.wall_ns(t_ns) - self.origin_ns) / 1000

    def instant(self, name: str, tid: int, t_ns: int, args: dict[str, Any]) -> Event:
        return {"ph": "i", "s": "t", "name": name, "pid": self.pid, "tid": tid, "ts": self.ts(t_ns), "args": args}


def metadata_events(header: Header, pid: int = PID, label: str | None = None) -> list[Event]:
    """Names of the process and its threads; ``label``: one rank of several (sorted by pid)."""
    if label is None:
        rank = f"tp{header.tp_rank}" + (f" dp{header.dp_rank}" if header.dp_rank is not None else "")
        name = f"sglang scheduler {header.host} pid {header.pid} {rank}"
    else:
        name = f"sglang scheduler {label} ({header.host} pid {header.pid})"
    events: list[Event] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
         "args": {"labels": f"sglang {header.sglang_version}, {header.server_args.schedule_policy}"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
    ]
    for tid, name in THREAD_NAMES.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return events


def pool_args(record: Pass, layout: PoolLayout | None) -> dict[str, Any]:
    """A hybrid pass's other pools and its limiting pool (nothing on a plain model)."""
    kv = record.kv
    values = {"kv_protected": kv.protected, "swa_free": kv.swa_available, "swa_evictable": kv.swa_evictable,
              "swa_protected": kv.swa_protected, "mamba_free": kv.mamba_available,
              "mamba_evictable": kv.mamba_evictable, "mamba_protected": kv.mamba_protected,
              "limiting_pool": limiting_pool(pool_counts(kv, layout))}
    return {k: v for k, v in values.items() if v is not None}


def counter_values(record: Pass) -> tuple[int | None, ...]:
    """The pass's value of each of ``COUNTERS`` (None: the pool does not exist)."""
    kv = record.kv
    return (len(record.waiting), len(record.running), kv.available, kv.evictable, kv.swa_available,
            kv.swa_evictable, kv.mamba_available, kv.mamba_evictable)


def pass_event(record: Pass, track: Track, layout: PoolLayout | None = None) -> Event:
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
    args.update(pool_args(record, layout))
    return {"ph": "X", "name": pass_result(record), "pid": track.pid, "tid": TID_PASSES,
            "ts": track.ts(record.t_ns), "dur": max(record.dur_ns, 0) / 1000, "args": args}


@dataclass
class _Requests:
    """Async slices per request; holds only requests still open."""

    track: Track
    state: dict[str, str] = field(default_factory=dict)  # rid -> "queued" | "running"

    def _slice(self, ph: str, name: str, rid: str, t_ns: int, args: dict[str, Any] | None = None) -> Event:
        event: Event = {"ph": ph, "cat": REQUEST_CATEGORY, "name": name, "id": self.track.scope + rid,
                        "pid": self.track.pid, "tid": TID_PASSES, "ts": self.track.ts(t_ns)}
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

    def __init__(self, threshold: int, header: Header, track: Track) -> None:
        self.scanner = StallScanner(threshold, header)
        self.track = track
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
            yield self.track.instant("stall", TID_STALLS, onset_ns, {
                "source": "the recorded decisions", "start_pass": stall.start_pass, "end_pass": stall.end_pass,
                "passes": stall.passes, "head_rid": stall.head_rid,
            })
        self.reported = len(self.scanner.stalls)


def divergence_event(div: Divergence, track: Track) -> Event:
    return track.instant("divergence: " + ", ".join(div.kinds), TID_DIVERGENCES, div.t_ns, {
        "pass": div.pass_, "kinds": div.kinds, "fixes": div.fixes,
        "old": msgspec.to_builtins(div.old), "new": msgspec.to_builtins(div.new),
    })


def stall_event(arm: str, stall: Stall, t_ns: int, track: Track) -> Event:
    return track.instant(f"stall ({arm})", TID_STALLS, t_ns, {
        "source": "replay report", "arm": arm, "start_pass": stall.start_pass, "end_pass": stall.end_pass,
        "passes": stall.passes, "head_rid": stall.head_rid,
    })


@dataclass
class ChromeStats:
    passes: int = 0
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by phase


def trace_events(
    reader: Reader, report: Report | None = None, *, stall_passes: int = DEFAULT_STALL_PASSES
) -> Iterator[Event]:
    """Every Trace Event of one trace, in record order."""
    yield from metadata_events(reader.header)
    yield from record_events(reader, Track.alone(reader.header), report, stall_passes=stall_passes)


def run_events(ranks: Sequence[Reader], *, stall_passes: int = DEFAULT_STALL_PASSES) -> Iterator[Event]:
    """Every Trace Event of several ranks: a process each (pid 1, 2, ... in the order given), merged
    by timestamp on the wall clock from the earliest rank's start."""
    origin = min(r.header.start_wall_ns for r in ranks)
    streams = []
    for pid, reader in enumerate(ranks, start=1):
        label = rank_label(reader.header)
        yield from metadata_events(reader.header, pid, label)
        track = Track(pid, WallClock.of(reader.header), origin, scope=f"{label}/")
        streams.append(record_events(reader, track, None, stall_passes=stall_passes))
    yield from heapq.merge(*streams, key=lambda event: event["ts"])


def record_events(
    reader: Reader, track: Track, report: Report | None = None, *, stall_passes: int = DEFAULT_STALL_PASSES
) -> Iterator[Event]:
    """The events of one trace's records on ``track`` (no metadata)."""
    layout = reader.header.pools
    divergences: dict[int, list[Divergence]] = defaultdict(list)
    stalls: dict[int, list[tuple[str, Stall]]] = defaultdict(list)
    if report is not None:
        for div in report.divergences:
            divergences[div.pass_].append(div)
        for arm, arm_stalls in sorted(report.stalls.items()):
            for stall in arm_stalls:
                stalls[stall.start_pass].append((arm, stall))
    runs = _StallRuns(stall_passes, reader.header, track) if report is None else None
    requests = _Requests(track)
    counters: dict[str, int] = {}
    last_t = 0
    instant = track.instant
    for _, record in reader.records():
        kind = type(record)
        last_t = max(last_t, getattr(record, "t_ns", 0))
        if kind is Pass:
            yield pass_event(record, track, layout)
            for name, value in zip(COUNTERS, counter_values(record)):
                if value is not None and counters.get(name) != value:
                    counters[name] = value
                    yield {"ph": "C", "name": name, "pid": track.pid, "tid": TID_PASSES, "ts": track.ts(record.t_ns),
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
                yield stall_event(arm, stall, record.t_ns, track)
            for div in divergences.pop(record.seq, ()):
                yield divergence_event(div, track)
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
        elif kind is Clock:
            track.clock.observe(record)
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


CLOCK_NOTE = "wall time since start_wall_ns: t_ns placed by the header and the latest clock record"


def export_chrome(
    reader: Reader, out: IO[bytes], report: Report | None = None, *, stall_passes: int = DEFAULT_STALL_PASSES
) -> ChromeStats:
    """One trace (one rank) as one process."""
    header = reader.header
    other = {"schedtrace_trace": reader.path, "sglang_version": header.sglang_version,
             "start_wall_ns": header.start_wall_ns, "clock": CLOCK_NOTE}
    if report is not None:
        other["replay"] = {"old": report.old, "new": report.new}
    return write_events(trace_events(reader, report, stall_passes=stall_passes), out, other_data=other)


def export_chrome_ranks(
    ranks: Sequence[Reader], out: IO[bytes], *, stall_passes: int = DEFAULT_STALL_PASSES
) -> ChromeStats:
    """Several ranks of one run, a process each, on one timeline."""
    other = {"schedtrace_traces": {rank_label(r.header): r.path for r in ranks},
             "sglang_version": ranks[0].header.sglang_version,
             "start_wall_ns": min(r.header.start_wall_ns for r in ranks), "clock": CLOCK_NOTE}
    return write_events(run_events(ranks, stall_passes=stall_passes), out, other_data=other)
