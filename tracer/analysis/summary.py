"""What one rank's trace holds, and what looks wrong: the data behind ``schedtrace info``.

``summarize`` is pure over a ``TraceReader`` (one file) or a ``RankTrace``
(a rank's parts read as one) and returns plain JSON-ready data
(``schedtrace info --json``); the CLI only renders it.

Pools: on a hybrid model, each pool's size, its last and lowest free +
evictable count, and in how many passes it was the limiting pool
(``schedtrace.tracer.analysis.pools`` defines it).

Anomalies:

* failed allocation: an ``alloc`` record with ``ok`` false;
* exception: a pass with ``error`` set, or a ``hook_error`` record;
* stall: at least ``stall_passes`` consecutive passes (repeats counted) where
  ``stalls.STALL_RULE`` holds: requests wait and nothing is admitted (no
  request, no chunk), although a request slot is free and the head request
  fits in free + evictable KV minus the running requests' decode reservation
  (``schedtrace.tracer.analysis.stalls`` holds the one definition).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

import msgspec

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.holes import holes_of
from schedtrace.tracer.analysis.pools import FULL, MAMBA, UNITS, PoolCounts, limiting_pool, pool_counts
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.contract.report import Stall
from schedtrace.tracer.analysis.settings import unreplayed
from schedtrace.tracer.contract.schema import Alloc, HookError, Idle, Loss, Pass, PoolLayout
from schedtrace.tracer.contract.traceset import RankTrace, source_paths

Reader = TraceReader | RankTrace

MAX_LISTED: Final = 20  # anomalies listed per kind (all are counted)
# The pool an ``Alloc.op`` draws from, where it is not the full KV pool (whose unit is tokens).
ALLOC_POOLS: Final = {"mamba_alloc": MAMBA}


def stall_row(reader: Reader, stall: Stall) -> dict[str, Any]:
    """One stall with the time and free KV at its onset."""
    onset = reader.pass_at(stall.start_pass - reader.header.first_pass)
    return {
        "first_pass": stall.start_pass, "passes": stall.passes, "t_ns": onset.t_ns,
        "head_rid": stall.head_rid, "kv_free": onset.kv.available + onset.kv.evictable,
    }


def header_facts(reader: Reader) -> dict[str, Any]:
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
        "pools": None if header.pools is None else _fields(header.pools),
        "prefix_block": header.prefix_block,  # 0: no prefix ids (an older recorder)
        "settings": dict(header.settings),
        "unreplayed": unreplayed(header.settings),
    }


def _fields(layout: PoolLayout) -> dict[str, Any]:
    return {f: getattr(layout, f) for f in layout.__struct_fields__}


class _PoolTally:
    """Per pool: the last counts, the lowest free + evictable and where, and the passes it limited."""

    def __init__(self) -> None:
        self.last: dict[str, PoolCounts] = {}
        self.lowest: dict[str, tuple[int, int]] = {}  # pool -> (free + evictable, pass seq)
        self.limiting: Counter[str] = Counter()  # pool -> passes (repeats counted)
        self.pools_seen = 1

    def feed(self, record: Pass, layout: PoolLayout | None) -> None:
        pools = pool_counts(record.kv, layout)
        self.pools_seen = max(self.pools_seen, len(pools))
        for p in pools:
            self.last[p.pool] = p
            room = p.free + p.evictable
            if p.pool not in self.lowest or room < self.lowest[p.pool][0]:
                self.lowest[p.pool] = (room, record.seq)
        limit = limiting_pool(pools)
        if limit is not None:
            self.limiting[limit] += record.repeat

    def rows(self) -> list[dict[str, Any]] | None:
        """One row per pool, or None for a plain model (one pool: nothing to compare)."""
        if self.pools_seen < 2:
            return None
        return [{
            "pool": name, "unit": UNITS[name], "size": p.size, "free": p.free, "evictable": p.evictable,
            "protected": p.protected, "lowest_free_evictable": self.lowest[name][0],
            "lowest_at_pass": self.lowest[name][1], "limiting_passes": self.limiting.get(name, 0),
        } for name, p in self.last.items()]


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


def summarize(reader: Reader, stall_passes: int = DEFAULT_STALL_PASSES) -> dict[str, Any]:
    """Header, counts, idle passes, losses, truncation and anomalies of one trace."""
    tags: Counter[str] = Counter()
    passes = folded = idle = lost = 0
    losses: list[tuple[int, Loss]] = []
    last_t = 0
    anomalies = _Anomalies()
    scanner = StallScanner(stall_passes, reader.header)
    pools = _PoolTally()
    layout = reader.header.pools

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
            pools.feed(record, layout)
        elif kind is Idle:
            idle += record.count
        elif kind is Loss:
            lost += record.count
            losses.append((offset, record))
        elif kind is Alloc and not record.ok:
            anomalies.failed_alloc({
                "offset": offset, "pass_seq": record.pass_seq, "op": record.op,
                "requested": record.requested, "available": record.available,
                "evictable": record.evictable, "unit": UNITS[ALLOC_POOLS.get(record.op, FULL)],
            })
        elif kind is HookError:
            anomalies.exception({"kind": "hook", "hook": record.hook, "offset": offset,
                                 "message": record.message, "count": record.count})
    stalls = [stall_row(reader, stall) for stall in scanner.finish()]
    tags.pop("header", None)
    return {
        "file": reader.path,
        "parts": list(source_paths(reader)),
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
        "pools": pools.rows(),
        "holes": msgspec.to_builtins(holes_of(reader.gaps, losses, reader.pass_offsets, reader.header.first_pass)),
        "anomalies": {
            "failed_allocs": anomalies.failed_alloc_count,
            "failed_alloc_list": anomalies.failed_allocs,
            "exceptions": anomalies.exception_count,
            "exception_list": anomalies.exceptions,
            "stall_passes": stall_passes,
            "stalls_while_kv_free": stalls,
            # passes the stall rule judged on an estimate, by why (empty: it was exact on every pass)
            "stall_rule_estimates": dict(sorted(scanner.estimates.items())),
        },
    }
