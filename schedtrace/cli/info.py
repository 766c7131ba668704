"""``schedtrace info TRACE...``: what each rank's trace holds, and what looks wrong.

The summary itself is ``schedtrace.tracer.analysis.summary`` (pure, also the
``--json`` output), with the trace's holes (``tracer.analysis.holes``) under
``holes``; this module only renders it, one rank after another. Every rank
is read past its unreadable regions, as replay reads it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click
import msgspec

from schedtrace.cli.holes import print_holes
from schedtrace.cli.options import chosen_ranks, json_option, stall_passes_option, damaged_traces_argument
from schedtrace.cli.per_rank import write_reports
from schedtrace.cli.style import compact_table, plural
from schedtrace.tracer.analysis.stalls import STALL_RULE
from schedtrace.tracer.analysis.summary import summarize
from schedtrace.tracer.contract.report import Holes
from schedtrace.tracer.contract.traceset import TraceSet

if TYPE_CHECKING:
    from rich.console import Console


def _holes(summary: dict[str, Any]) -> Holes:
    """The summary's holes (none in a summary made without them)."""
    return msgspec.convert(summary.get("holes", {}), Holes)


def _file_state(summary: dict[str, Any]) -> str:
    regions = _holes(summary).region_count
    if summary["closed_cleanly"] and not regions:  # never "cleanly" over an unreadable region
        return "closed cleanly"
    if regions:
        return f"NOT closed cleanly: {plural(regions, 'unreadable region')} (holes below)"
    if summary["truncated_at"] is not None:
        return f"NOT closed cleanly; valid data ends at offset {summary['truncated_at']}"
    return "NOT closed cleanly (no torn tail)"


def _lost(summary: dict[str, Any]) -> str:
    """Every record lost: in unreadable regions and counted by loss records (the holes above)."""
    holes = _holes(summary)
    if not holes.count:
        return str(summary["lost"])
    return f"{holes.records_lost:,}{' or more' if holes.unknown_regions else ''} (holes above)"


def _anomalies(a: dict[str, Any], console: Console) -> None:
    console.print("[bold]anomalies[/bold]")
    console.print(f"  failed allocations: {a['failed_allocs']}")
    for f in a["failed_alloc_list"]:
        unit = f.get("unit", "tokens").removesuffix("s")  # a summary from before the field: KV tokens
        console.print(f"    after pass {f['pass_seq']}: {f['op']} {plural(f['requested'], unit)}, "
                      f"available {f['available']} + evictable {f['evictable']}")
    console.print(f"  exceptions: {a['exceptions']}")
    for e in a["exception_list"]:
        where = f"pass {e['seq']}" if e["kind"] == "pass" else f"hook {e['hook']}"
        console.print(f"    {where}: {e['message']}")
    stalls = a["stalls_while_kv_free"]
    from rich.padding import Padding

    console.print(f"  stalls: {len(stalls)}, each at least {plural(a['stall_passes'], 'pass')} where")
    console.print(Padding(STALL_RULE, (0, 0, 0, 4), expand=False), highlight=False)
    if stalls:

        table = compact_table(("from pass", "passes", "head", "KV free"), shrink=("head",))
        for s in stalls:
            table.add_row(str(s["first_pass"]), str(s["passes"]), s["head_rid"] or "-", str(s["kv_free"]))
        console.print(Padding(table, (0, 0, 0, 4), expand=False))
    for why, passes in a["stall_rule_estimates"].items():
        console.print(f"    the rule is an estimate on {plural(passes, 'pass')}: {why}", soft_wrap=True)


def _pools(pools: list[dict[str, Any]], console: Console) -> None:
    # lowest: the least free + evictable and its pass; limiting: passes it had the least headroom
    table = compact_table(("pool", "size", "free", "evictable", "protected", "lowest\n@ pass", "limiting\npasses"),
                          shrink=("pool",), title="pools at the last pass")
    for p in pools:
        size = "?" if p["size"] is None else str(p["size"])
        protected = "-" if p["protected"] is None else str(p["protected"])
        table.add_row(f"{p['pool']} ({p['unit']})", size, str(p["free"]), str(p["evictable"]), protected,
                      f"{p['lowest_free_evictable']} @{p['lowest_at_pass']}", str(p["limiting_passes"]))
    console.print(table)


def render(summary: dict[str, Any], console: Console) -> None:
    h = summary["header"]
    console.print(f"[bold]{summary['file']}[/bold]")
    if len(summary["parts"]) > 1:
        console.print(f"read as one trace with {plural(len(summary['parts']) - 1, 'later part')}: "
                      + ", ".join(summary["parts"][1:]))
    console.print(f"model {h['model']}")
    console.print(f"sglang {h['sglang_version']}, schedtrace {h['schedtrace_version']}")
    dp = "" if h["dp_rank"] is None else f", dp rank {h['dp_rank']}"  # null: no DP attention
    console.print(f"host {h['host']}, pid {h['pid']}, tp rank {h['tp_rank']}{dp}, "
                  f"part {h['part']} from pass {h['first_pass']}")
    args = compact_table(("server arg", "value"), shrink=("value",))
    for key, value in h["server_args"].items():
        args.add_row(key, str(value))
    console.print(args)
    if h["prefix_block"]:
        console.print(f"prefix ids: recorded, one per {h['prefix_block']} tokens; "
                      f"{len(h['settings'])} scheduler settings recorded")
    else:
        console.print("prefix ids: none (an older recorder): replay shares no prefixes, "
                      "and cache-aware queue orders are not checked")
    for line in h["unreplayed"]:
        console.print(f"  replay cannot reproduce: {line}", soft_wrap=True)
    console.print(f"file: {summary['file_size']} bytes, {_file_state(summary)}")
    print_holes(_holes(summary), console)
    counts = compact_table(("contents", "count"), shrink=("count",))
    counts.add_row("duration", f"{summary['duration_ns'] / 1e9:.3f} s")
    counts.add_row("passes", f"{summary['passes']} in {plural(summary['pass_records'], 'record')} "
                   f"({summary['folded_passes']} folded)")
    counts.add_row("idle passes", str(summary["idle_passes"]))
    counts.add_row("requests (arrivals)", str(summary["requests"]))
    for tag, n in summary["events"].items():
        counts.add_row(f"  {tag} records", str(n))
    counts.add_row("lost records", _lost(summary))
    if summary["unknown_records"]:
        counts.add_row("unknown records", ", ".join(f"{k}: {v}" for k, v in summary["unknown_records"].items()))
    console.print(counts)
    if summary["pools"] is not None:
        _pools(summary["pools"], console)
    _anomalies(summary["anomalies"], console)




@click.command(short_help="Summarize a trace: contents and anomalies, per rank.")
@damaged_traces_argument
@json_option("the summary (several ranks: one per rank)")
@stall_passes_option("--min-run")
def info(traces: TraceSet, rank: str | None, run_id: str | None, json_out: str | None, stall_passes: int) -> None:
    """Summarize each rank of TRACE... (files, globs or directories; a rank's parts read as one):
    header, counts, idle passes, losses, truncation, the pools of a hybrid model, and anomalies
    (failed allocations, exceptions, stalls: see --stall-passes)."""
    with traces:
        run, ranks = chosen_ranks(traces, rank, run_id)
        summaries = {r.label: summarize(r, stall_passes) for r in ranks}
    write_reports(run, summaries, json_out, _dumped, render)


def _dumped(summary: dict[str, Any]) -> bytes:
    return json.dumps(summary, sort_keys=True).encode() + b"\n"
