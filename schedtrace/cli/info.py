"""``schedtrace info TRACE``: what one trace file holds, and what looks wrong.

The summary itself is ``schedtrace.tracer.analysis.summary`` (pure, also the
``--json`` output); this module only renders it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from schedtrace.cli.options import STDOUT, json_option, stall_passes_option, trace_argument, write_json
from schedtrace.cli.style import compact_table, plural, summary_console
from schedtrace.tracer.analysis.summary import summarize
from schedtrace.tracer.contract.format import TraceReader

if TYPE_CHECKING:
    from rich.console import Console


def _file_state(summary: dict[str, Any]) -> str:
    if summary["closed_cleanly"]:
        return "closed cleanly"
    if summary["truncated_at"] is not None:
        return f"NOT closed cleanly; valid data ends at offset {summary['truncated_at']}"
    return "NOT closed cleanly (no torn tail)"


def _anomalies(a: dict[str, Any], console: Console) -> None:
    console.print("[bold]anomalies[/bold]")
    console.print(f"  failed allocations: {a['failed_allocs']}")
    for f in a["failed_alloc_list"]:
        console.print(f"    after pass {f['pass_seq']}: {f['op']} {f['requested']} tokens, "
                      f"available {f['available']} + evictable {f['evictable']}")
    console.print(f"  exceptions: {a['exceptions']}")
    for e in a["exception_list"]:
        where = f"pass {e['seq']}" if e["kind"] == "pass" else f"hook {e['hook']}"
        console.print(f"    {where}: {e['message']}")
    stalls = a["stalls_while_kv_free"]
    title = f"  stalls while a slot and KV were free (at least {plural(a['stall_passes'], 'pass')}): {len(stalls)}"
    console.print(title)
    if stalls:
        from rich.padding import Padding

        table = compact_table(("from pass", "passes", "head", "KV free"), shrink=("head",))
        for s in stalls:
            table.add_row(str(s["first_pass"]), str(s["passes"]), s["head_rid"] or "-", str(s["kv_free"]))
        console.print(Padding(table, (0, 0, 0, 4), expand=False))


def render(summary: dict[str, Any], console: Console) -> None:
    h = summary["header"]
    console.print(f"[bold]{summary['file']}[/bold]")
    console.print(f"model {h['model']}")
    console.print(f"sglang {h['sglang_version']}, schedtrace {h['schedtrace_version']}")
    console.print(f"host {h['host']}, pid {h['pid']}, tp rank {h['tp_rank']}, dp rank {h['dp_rank']}, "
                  f"part {h['part']} from pass {h['first_pass']}")
    args = compact_table(("server arg", "value"), shrink=("value",))
    for key, value in h["server_args"].items():
        args.add_row(key, str(value))
    console.print(args)
    console.print(f"file: {summary['file_size']} bytes, {_file_state(summary)}")
    counts = compact_table(("contents", "count"), shrink=("count",))
    counts.add_row("duration", f"{summary['duration_ns'] / 1e9:.3f} s")
    counts.add_row("passes", f"{summary['passes']} in {plural(summary['pass_records'], 'record')} "
                   f"({summary['folded_passes']} folded)")
    counts.add_row("idle passes", str(summary["idle_passes"]))
    counts.add_row("requests (arrivals)", str(summary["requests"]))
    for tag, n in summary["events"].items():
        counts.add_row(f"  {tag} records", str(n))
    counts.add_row("lost records", str(summary["lost"]))
    if summary["unknown_records"]:
        counts.add_row("unknown records", ", ".join(f"{k}: {v}" for k, v in summary["unknown_records"].items()))
    console.print(counts)
    _anomalies(summary["anomalies"], console)


@click.command(short_help="Summarize a trace: contents and anomalies.")
@trace_argument
@json_option("the summary")
@stall_passes_option("--min-run")
def info(trace: Path, json_out: str | None, stall_passes: int) -> None:
    """Summarize TRACE: header, counts, idle passes, losses, truncation and anomalies
    (failed allocations, exceptions, stalls while KV was free)."""
    with TraceReader(trace) as reader:
        summary = summarize(reader, stall_passes)
    if json_out is not None:
        write_json(json_out, json.dumps(summary, sort_keys=True).encode() + b"\n")
    if json_out != STDOUT:
        render(summary, summary_console())
