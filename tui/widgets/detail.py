"""The detail pane: one pass's recorded state and the two arms' decisions side by side."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from replay.report import Decision, Divergence, Mismatch
from tui.model import decision_diff, humanize_ns, pass_result, recorded_decision
from tracer.schema import Pass

MAX_QUEUE_ROWS = 40


def _decision_table(title: str, left_name: str, left: Decision, right_name: str, right: Decision) -> Table:
    table = Table(title=title, title_justify="left", expand=True, show_edge=False, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column(left_name)
    table.add_column(right_name)
    for diff in decision_diff(left, right):
        if diff.differs:
            table.add_row(Text(f"≠ {diff.name}", style="bold yellow"), Text(diff.old, style="red"),
                          Text(diff.new, style="green"))
        else:
            table.add_row(Text(f"  {diff.name}", style="dim"), Text(diff.old, style="dim"),
                          Text(diff.new, style="dim"))
    return table


def _queue_table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=f"{title} ({len(rows)})", title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows[:MAX_QUEUE_ROWS]:
        table.add_row(*row)
    if len(rows) > MAX_QUEUE_ROWS:
        table.add_row(f"… {len(rows) - MAX_QUEUE_ROWS} more", *[""] * (len(columns) - 1))
    return table


def pass_detail(p: Pass, *, divergence: Divergence | None, mismatch: Mismatch | None, arms: tuple[str, str] | None,
                in_stall: bool, failed_alloc: bool) -> RenderableType:
    parts: list[RenderableType] = []
    title = Text(f"Pass {p.seq}", style="bold")
    title.append(f"  t={humanize_ns(p.t_ns)}  took {p.dur_ns / 1e3:.0f}µs  result {pass_result(p)}")
    if p.repeat > 1:
        title.append(f"  ×{p.repeat} identical")
    if p.idle_before:
        title.append(f"  {p.idle_before} idle before", style="dim")
    parts.append(title)
    flags = []
    if divergence is not None:
        flags.append(Text(f"◆ divergence: {', '.join(divergence.kinds)}", style="bold magenta"))
        fixes = ", ".join(divergence.fixes) or "none alone (needs several fixes together)"
        flags.append(Text(f"  fixes responsible: {fixes}", style="magenta"))
    if in_stall:
        flags.append(Text("▬ inside a stall", style="bold yellow"))
    if p.error:
        flags.append(Text(f"✖ raised: {p.error}", style="bold red"))
    if failed_alloc:
        flags.append(Text("✖ a KV allocation failed after this pass", style="bold red"))
    parts.extend(flags)

    recorded = recorded_decision(p)
    if divergence is not None and arms is not None:
        parts.append(_decision_table("Decisions", arms[0], divergence.old, arms[1], divergence.new))
    elif arms is not None:
        parts.append(Text(f"{arms[0]} and {arms[1]} decide the same here.", style="dim"))
    if mismatch is not None:
        parts.append(_decision_table(f"Replay fidelity: replayed differs in {', '.join(mismatch.fields)}",
                                     "recorded", mismatch.recorded, "replayed", mismatch.replayed))
    if divergence is None:
        table = Table(title="Recorded decision", title_justify="left", show_edge=False, show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value")
        for diff in decision_diff(recorded, recorded):
            table.add_row(diff.name, diff.old)
        parts.append(table)

    state = Table(title="Recorded state", title_justify="left", show_edge=False, show_header=False)
    state.add_column("field", style="bold")
    state.add_column("value")
    kv = p.kv
    state.add_row("kv free / evictable", f"{kv.available} / {kv.evictable}")
    if kv.swa_available is not None:
        state.add_row("swa free / evictable", f"{kv.swa_available} / {kv.swa_evictable}")
    if kv.mamba_available is not None:
        state.add_row("mamba free / evictable", f"{kv.mamba_available} / {kv.mamba_evictable}")
    state.add_row("request slots free", str(p.req_slots_free))
    state.add_row("new_token_ratio", f"{p.new_token_ratio:.3f}")
    state.add_row("chunked_prefill_size", str(p.chunked_prefill_size))
    state.add_row("batch_is_full in → out", f"{p.batch_is_full_in} → {p.batch_is_full_out}")
    if p.chunked is not None:
        c = p.chunked
        state.add_row("chunked request", f"{c.rid}: {c.prefix_len}/{c.input_len} prefilled")
    if p.chunk is not None:
        state.add_row("continuing chunk", f"budget {p.chunk.budget}, size {p.chunk.size}")
    if p.new_chunked_rid:
        state.add_row("new chunked request", p.new_chunked_rid)
    parts.append(state)
    if p.candidates:
        parts.append(_queue_table("Candidates", ["rid", "prefix", "extend", "result"],
                                  [[c.rid, str(c.prefix_len), str(c.extend_len), c.result] for c in p.candidates]))
    parts.append(_queue_table("Waiting", ["#", "rid", "input", "prefix", "max_new"],
                              [[str(i + 1), w.rid, str(w.input_len), str(w.prefix_len), str(w.max_new_tokens)]
                               for i, w in enumerate(p.waiting)]))
    parts.append(_queue_table("Running", ["rid", "input", "output", "max_new"],
                              [[r.rid, str(r.input_len), str(r.output_len), str(r.max_new_tokens)] for r in p.running]))
    return Group(*parts)


class DetailPane(VerticalScroll):
    DEFAULT_CSS = """
    DetailPane { width: 1fr; border-left: solid $primary-darken-2; padding: 0 1; }
    """

    def compose(self):
        yield Static("No pass selected.", id="detail-body")

    def show(self, renderable: RenderableType) -> None:
        self.query_one("#detail-body", Static).update(renderable)
        self.scroll_home(animate=False)
