"""The detail pane's lines for one pass: its recorded state and the two arms' decisions side by side."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.analysis.outcome import pass_outcome
from schedtrace.tracer.analysis.why import Why
from schedtrace.tracer.contract.report import Decision, Divergence, Mismatch
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tui.model.diff import decision_diff
from schedtrace.tui.model.durations import humanize_ns
from schedtrace.tui.model.marks import GLYPHS, StallRun
from schedtrace.tui.model.pools import pool_rows
from schedtrace.tui.model.rids import short_rid
from schedtrace.tui.widgets import palette

MAX_QUEUE_ROWS = 40

Cell = Text | str


def table_lines(title: str, header: list[str] | None, rows: list[list[Cell]], *,
                first_style: str = "") -> list[Text]:
    """A table as plain lines (title, ``┃`` header, ``━╇━`` rule, ``│`` rows).

    Drawn by hand rather than with a rich ``Table``: the pane redraws on every
    cursor move and a rich table costs milliseconds per cell.
    """
    columns = len(header) if header else len(rows[0]) if rows else 0
    widths = [len(header[i]) if header else 0 for i in range(columns)]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], cell.cell_len if isinstance(cell, Text) else len(cell))
    lines = [Text(title, style="italic")]

    def join(cells: list[Cell], separator: str, style: str = "") -> Text:
        line = Text(style=style)
        for i, cell in enumerate(cells):
            if i:
                line.append(separator, style="dim" if not style else "")
            text = cell if isinstance(cell, Text) else Text(cell, style=first_style if i == 0 else "")
            line.append_text(text)
            if i < columns - 1:
                line.append(" " * (widths[i] - text.cell_len))
        return line

    if header:
        lines.append(join(list(header), " ┃ ", "bold"))
        lines.append(Text("━╇━".join("━" * w for w in widths), style="dim"))
    lines.extend(join(row, " │ ") for row in rows)
    return lines


def _decision_table(title: str, left_name: str, left: Decision, right_name: str, right: Decision) -> list[Text]:
    rows: list[list[Cell]] = []
    for diff in decision_diff(left, right):
        if diff.differs:
            rows.append([Text(f"≠ {diff.name}", style="bold yellow"), Text(diff.old, style="red"),
                         Text(diff.new, style="green")])
        else:
            rows.append([Text(f"  {diff.name}", style="dim"), Text(diff.old, style="dim"),
                         Text(diff.new, style="dim")])
    return table_lines(title, ["field", left_name, right_name], rows)


def _queue_table(title: str, columns: list[str], rows: list[tuple[str, list[str]]], searched: str | None
                 ) -> list[Text]:
    """``rows`` are (rid, cells with the short rid); the searched rid's row is highlighted, kept in view."""
    found = next((i for i, (rid, _) in enumerate(rows) if rid == searched), None)
    picked = list(range(min(len(rows), MAX_QUEUE_ROWS)))
    if found is not None and found >= MAX_QUEUE_ROWS:
        picked[-1] = found
    shown: list[list[Cell]] = [
        [Text(cell, style=palette.SEARCHED) for cell in rows[i][1]] if i == found else list(rows[i][1])
        for i in picked
    ]
    if len(rows) > MAX_QUEUE_ROWS:
        shown.append([f"… {len(rows) - MAX_QUEUE_ROWS} more", *[""] * (len(columns) - 1)])
    return table_lines(f"{title} ({len(rows)})", columns, shown)


def why_lines(lines: list[tuple[str | None, Why]]) -> list[Text]:
    """The "why nothing (more) was admitted" lines: one, or one per arm on a divergent pass."""
    out = []
    for arm, line in lines:
        text = Text("why", style="bold")
        text.append(f" ({arm})" if arm else "", style="bold")
        text.append(": ")
        text.append(line.text, style=palette.WHY_STYLES.get(line.reason, ""))
        out.append(Text.assemble(text, overflow="fold"))  # the pane folds these to its width
    return out


def _stall_lines(stalls: list[StallRun], arm_order: tuple[str, ...]) -> list[Text]:
    out = []
    for run in stalls:
        colour = palette.ARM_COLOURS[arm_order.index(run.arm)] if run.arm in arm_order else None
        text = Text(palette.STALL_BAR, style=colour.mark if colour else "", overflow="fold")
        text.append(f" inside a {run.describe()}", style="bold")
        out.append(text)
    return out


def pass_detail(p: Pass, *, divergence: Divergence | None, mismatch: Mismatch | None, arms: tuple[str, str] | None,
                stalls: list[StallRun], arm_order: tuple[str, ...], failed_alloc: bool,
                why: list[tuple[str | None, Why]], searched: str | None = None,
                events: Sequence[Text] = ()) -> list[Text]:
    """The pane's lines for one pass; ``searched``: the rid found with ``/`` (its rows are highlighted);
    ``events``: lines about the other ranks and the file's damage here (``rank_lines.py``)."""
    parts: list[Text] = []
    title = Text(f"Pass {p.seq}", style="bold")
    title.append(f"  t={humanize_ns(p.t_ns)}  took {p.dur_ns / 1e3:.0f}µs  result {pass_outcome(p)}")
    if p.repeat > 1:
        title.append(f"  ×{p.repeat} identical")
    if p.idle_before:
        title.append(f"  {p.idle_before} idle before", style="dim")
    parts.append(title)
    parts.extend(why_lines(why))
    if divergence is not None:
        kinds = ", ".join(divergence.kinds)
        parts.append(Text(f"{GLYPHS['divergence']} divergence: {kinds}", style="bold magenta"))
        fixes = ", ".join(divergence.fixes) or "none alone (needs several fixes together)"
        parts.append(Text(f"  fixes responsible: {fixes}", style="magenta"))
    parts.extend(_stall_lines(stalls, arm_order))
    if p.error:
        parts.append(Text(f"{GLYPHS['error']} raised: {p.error}", style="bold red"))
    if failed_alloc:
        parts.append(Text(f"{GLYPHS['error']} a KV allocation failed after this pass", style="bold red"))
    parts.extend(events)

    if divergence is not None and arms is not None:
        parts.extend(_decision_table("Decisions", arms[0], divergence.old, arms[1], divergence.new))
    elif arms is not None:
        parts.append(Text(f"{arms[0]} and {arms[1]} decide the same here.", style="dim"))
    if mismatch is not None:
        parts.extend(_decision_table(f"Replay fidelity: replayed differs in {', '.join(mismatch.fields)}",
                                     "recorded", mismatch.recorded, "replayed", mismatch.replayed))
    if divergence is None:
        recorded = recorded_decision(p)
        parts.extend(table_lines("Recorded decision", None,
                                 [[diff.name, diff.old] for diff in decision_diff(recorded, recorded)],
                                 first_style="bold"))

    state: list[list[Cell]] = [[label, value] for label, value in pool_rows(p.kv)]
    state.append(["request slots free", str(p.req_slots_free)])
    state.append(["new_token_ratio", f"{p.new_token_ratio:.3f}"])
    state.append(["chunked_prefill_size", str(p.chunked_prefill_size)])
    state.append(["batch_is_full in → out", f"{p.batch_is_full_in} → {p.batch_is_full_out}"])
    if p.chunked is not None:
        c = p.chunked
        state.append(["chunked request", f"{c.rid}: {c.prefix_len}/{c.input_len} prefilled"])
    if p.chunk is not None:
        state.append(["continuing chunk", f"budget {p.chunk.budget}, size {p.chunk.size}"])
    if p.new_chunked_rid:
        state.append(["new chunked request", p.new_chunked_rid])
    parts.extend(table_lines("Recorded state", None, state, first_style="bold"))
    if p.candidates:
        parts.extend(_queue_table("Candidates", ["rid", "prefix", "extend", "result"],
                                  [(c.rid, [short_rid(c.rid), str(c.prefix_len), str(c.extend_len), c.result])
                                   for c in p.candidates], searched))
    parts.extend(_queue_table("Waiting", ["#", "rid", "input", "prefix", "max_new"],
                              [(w.rid, [str(i + 1), short_rid(w.rid), str(w.input_len), str(w.prefix_len),
                                        str(w.max_new_tokens)]) for i, w in enumerate(p.waiting)], searched))
    parts.extend(_queue_table("Running", ["rid", "input", "output", "max_new"],
                              [(r.rid, [short_rid(r.rid), str(r.input_len), str(r.output_len), str(r.max_new_tokens)])
                               for r in p.running], searched))
    return parts
