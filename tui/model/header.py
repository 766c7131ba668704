"""The header bar's facts about a trace, and which of them fit one line."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path

from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.schema import Header
from schedtrace.tui.model.damage import GapView
from schedtrace.tui.model.durations import humanize_ns

SEPARATOR = "  "


@dataclass(frozen=True)
class HeaderItem:
    label: str  # shown dim before the value ("" for none)
    value: str
    drop: int = 0  # 0: always shown; otherwise the highest is left out first when the line is too narrow
    alarm: bool = False  # shown in red
    accent: bool = False  # the replay's result

    @property
    def width(self) -> int:
        return len(self.label) + (1 if self.label else 0) + len(self.value)


def header_items(header: Header, *, pass_count: int, duration_ns: int | None, losses: int,
                 truncated_at: int | None, closed_cleanly: bool, rank: str | None = None,
                 gaps: Sequence[GapView] = (), ranks: tuple[str, bool] | None = None) -> list[HeaderItem]:
    """``rank``: which rank of how many (``tp1 2/4``); ``ranks``: what the comparison of the ranks
    says, and whether that is a desync; ``gaps``: the file's unreadable regions."""
    args = header.server_args
    here = f"tp{header.tp_rank}" + (f" dp{header.dp_rank}" if header.dp_rank is not None else "")
    items = [
        HeaderItem("", Path(args.model_path).name or args.model_path, drop=4),
        HeaderItem("sglang", header.sglang_version, drop=6),
        HeaderItem("rank", rank) if rank else HeaderItem("", here, drop=8),
        HeaderItem("policy", args.schedule_policy, drop=2),
        HeaderItem("chunk", str(args.chunked_prefill_size), drop=3),
        HeaderItem("max run", str(capacity.max_running(header))),
        HeaderItem("kv", str(capacity.kv_tokens(header) or "?")),
        HeaderItem("", humanize_ns(duration_ns) if duration_ns is not None else "…", drop=5),
        HeaderItem("passes", f"{pass_count:,}"),
        HeaderItem("lost", str(losses), drop=0 if losses else 9, alarm=bool(losses)),
    ]
    if ranks is not None:
        items.append(HeaderItem("ranks", ranks[0], drop=0 if ranks[1] else 1, alarm=ranks[1]))
    if gaps:
        lost = sum(gap.passes_lost for gap in gaps)
        items.append(HeaderItem("DAMAGED", f"{len(gaps)} gap{'s' if len(gaps) > 1 else ''}, {lost:,} passes lost "
                                "(i: list)", alarm=True))
    if truncated_at is not None:
        items.append(HeaderItem("TRUNCATED", f"at byte {truncated_at:,}", alarm=True))
    elif not closed_cleanly and not gaps:  # a file with gaps may have its footer: "no footer" would be wrong
        items.append(HeaderItem("unclosed", "no footer", alarm=True))
    if header.part:
        items.append(HeaderItem("part", str(header.part), drop=7))
    return items


def fit(items: list[HeaderItem], width: int) -> list[HeaderItem]:
    """``items`` less the fewest droppable ones (highest ``drop`` first) so that one line holds them."""
    shown = list(items)

    def total() -> int:
        return sum(item.width for item in shown) + len(SEPARATOR) * max(len(shown) - 1, 0)

    while total() > width:
        droppable = [item for item in shown if item.drop]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda item: item.drop))
    return shown
