"""The header bar's facts about a trace, as (label, value) pairs."""

from __future__ import annotations

from schedtrace.tracer.contract.schema import Header
from schedtrace.tui.model.durations import humanize_ns


def header_lines(header: Header, *, pass_count: int, duration_ns: int | None, losses: int,
                 truncated_at: int | None, closed_cleanly: bool) -> list[tuple[str, str]]:
    """(label, value) pairs for the header bar."""
    args = header.server_args
    rank = f"tp{header.tp_rank}" + (f" dp{header.dp_rank}" if header.dp_rank is not None else "")
    pairs = [
        ("model", args.model_path),
        ("sglang", header.sglang_version),
        ("rank", rank),
        ("policy", args.schedule_policy),
        ("chunk", str(args.chunked_prefill_size)),
        ("max running", str(args.max_running_requests)),
        ("max tokens", str(args.max_total_tokens)),
        ("duration", humanize_ns(duration_ns) if duration_ns is not None else "…"),
        ("passes", f"{pass_count:,}"),
        ("lost", str(losses)),
    ]
    if truncated_at is not None:
        pairs.append(("TRUNCATED", f"at byte {truncated_at:,}"))
    elif not closed_cleanly:
        pairs.append(("unclosed", "no footer"))
    if header.part:
        pairs.append(("part", str(header.part)))
    return pairs
