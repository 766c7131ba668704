"""``schedtrace info TRACE``: what one trace file holds, and what looks wrong.

``summarize`` is pure over a ``TraceReader`` and returns plain data (the
``--json`` output); ``render`` prints it with rich.

Anomalies:

* failed allocation: an ``alloc`` record with ``ok`` false;
* exception: a pass with ``error`` set, or a ``hook_error`` record;
* stall: at least ``--min-run`` consecutive passes (repeats counted) that
  admitted nothing and ran no chunk although a request slot was free and the
  head of the waiting queue fit in free + evictable KV (``schedtrace.tracer.analysis.stalls``
  holds the one definition).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import click

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Stall
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Alloc, HookError, Idle, Loss, Pass

DEFAULT_MIN_RUN = 100
MAX_LISTED = 20  # anomalies listed per kind (all are counted)


def _stall_row(reader: TraceReader, stall: Stall) -> dict[str, Any]:
    onset = reader.pass_at(stall.start_pass - reader.header.first_pass)
    return {
        "first_pass": stall.start_pass, "passes": stall.passes, "t_ns": onset.t_ns,
        "head_rid": stall.head_rid, "kv_free": onset.kv.available + onset.kv.evictable,
    }


def summarize(reader: TraceReader, min_run: int = DEFAULT_MIN_RUN) -> dict[str, Any]:
    header = reader.header
    tags: Counter[str] = Counter()
    passes = folded = idle = lost = 0
    last_t = 0
    failed_allocs: list[dict[str, Any]] = []
    failed_alloc_count = 0
    exceptions: list[dict[str, Any]] = []
    exception_count = 0
    scanner = StallScanner(min_run, header.server_args.max_running_requests)

    for offset, record in reader.records():
        tag = record.__struct_config__.tag
        tags[tag] += 1
        t = getattr(record, "t_ns", 0)
        last_t = max(last_t, t)
        kind = type(record)
        if kind is Pass:
            passes += record.repeat
            folded += record.repeat - 1
            if record.error is not None:
                exception_count += 1
                if len(exceptions) < MAX_LISTED:
                    exceptions.append({"kind": "pass", "seq": record.seq, "offset": offset, "message": record.error})
            scanner.feed_pass(record, recorded_decision(record))
        elif kind is Idle:
            idle += record.count
        elif kind is Loss:
            lost += record.count
        elif kind is Alloc and not record.ok:
            failed_alloc_count += 1
            if len(failed_allocs) < MAX_LISTED:
                failed_allocs.append({
                    "offset": offset, "pass_seq": record.pass_seq, "op": record.op,
                    "requested": record.requested, "available": record.available,
                    "evictable": record.evictable,
                })
        elif kind is HookError:
            exception_count += 1
            if len(exceptions) < MAX_LISTED:
                exceptions.append({"kind": "hook", "hook": record.hook, "offset": offset, "message": record.message, "count": record.count})
    stalls = [_stall_row(reader, stall) for stall in scanner.finish()]
    tags.pop("header", None)
    events = {k: v for k, v in sorted(tags.items()) if k != "pass"}
    return {
        "file": reader.path,
        "header": {
            "model": header.server_args.model_path,
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
            "server_args": {f: getattr(header.server_args, f) for f in header.server_args.__struct_fields__},
        },
        "closed_cleanly": reader.closed_cleanly,
        "truncated_at": reader.truncated_at,
        "file_size": reader.file_size,
        "pass_records": tags.get("pass", 0),
        "passes": passes,
        "folded_passes": folded,
        "idle_passes": idle,
        "events": events,
        "requests": tags.get("arrive", 0),
        "duration_ns": last_t,
        "lost": lost,
        "unknown_records": dict(sorted(reader.unknown_records.items())),
        "anomalies": {
            "failed_allocs": failed_alloc_count,
            "failed_alloc_list": failed_allocs,
            "exceptions": exception_count,
            "exception_list": exceptions,
            "stall_min_run": min_run,
            "stalls_while_kv_free": stalls,
        },
    }


def render(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    h = summary["header"]
    console.print(f"[bold]{summary['file']}[/bold]")
    console.print(
        f"model {h['model']}  sglang {h['sglang_version']}  schedtrace {h['schedtrace_version']}  "
        f"host {h['host']} pid {h['pid']}  tp {h['tp_rank']} dp {h['dp_rank']}  part {h['part']} "
        f"(first pass {h['first_pass']})"
    )
    args = Table(title="server args", show_header=False, box=None)
    for key, value in h["server_args"].items():
        args.add_row(key, str(value))
    console.print(args)
    state = "closed cleanly" if summary["closed_cleanly"] else (
        f"NOT closed cleanly; valid data ends at offset {summary['truncated_at']}"
        if summary["truncated_at"] is not None else "NOT closed cleanly (no torn tail)"
    )
    console.print(f"file: {summary['file_size']} bytes, {state}")
    counts = Table(title="contents", show_header=False, box=None)
    counts.add_row("duration", f"{summary['duration_ns'] / 1e9:.3f} s")
    counts.add_row("passes", f"{summary['passes']} in {summary['pass_records']} records ({summary['folded_passes']} folded)")
    counts.add_row("idle passes", str(summary["idle_passes"]))
    counts.add_row("requests (arrivals)", str(summary["requests"]))
    for tag, n in summary["events"].items():
        counts.add_row(f"  {tag}", str(n))
    counts.add_row("lost records", str(summary["lost"]))
    if summary["unknown_records"]:
        counts.add_row("unknown records", ", ".join(f"{k}: {v}" for k, v in summary["unknown_records"].items()))
    console.print(counts)
    a = summary["anomalies"]
    console.print("[bold]anomalies[/bold]")
    console.print(f"  failed allocations: {a['failed_allocs']}")
    for f in a["failed_alloc_list"]:
        console.print(f"    after pass {f['pass_seq']}: {f['op']} {f['requested']} tokens, available {f['available']} + evictable {f['evictable']}")
    console.print(f"  exceptions: {a['exceptions']}")
    for e in a["exception_list"]:
        where = f"pass {e['seq']}" if e["kind"] == "pass" else f"hook {e['hook']}"
        console.print(f"    {where}: {e['message']}")
    console.print(f"  stalls, slot and KV free (>= {a['stall_min_run']} passes): {len(a['stalls_while_kv_free'])}")
    for s in a["stalls_while_kv_free"]:
        console.print(f"    from pass {s['first_pass']}: {s['passes']} passes, head {s['head_rid']} fits in {s['kv_free']} free tokens")


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one deterministic JSON object.")
@click.option(
    "--min-run", default=DEFAULT_MIN_RUN, show_default=True, type=click.IntRange(min=1),
    help="Report a stall: this many consecutive passes (repeats counted) that admitted "
    "nothing and ran no chunk although a request slot was free and the head waiting "
    "request fit in free + evictable KV.",
)
def info(trace: str, as_json: bool, min_run: int) -> None:
    """Summarize TRACE: header, counts, idle passes, losses, truncation and anomalies
    (failed allocations, exceptions, stalls while KV was free)."""
    with TraceReader(trace) as reader:
        summary = summarize(reader, min_run)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        render(summary)
