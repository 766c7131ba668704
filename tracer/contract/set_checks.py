"""A trace set checked whole: each rank's parts in order and continuing, and the ranks a run lacks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from schedtrace.tracer.contract.errors import TraceSetError
from schedtrace.tracer.contract.rank_keys import rank_label, shown

if TYPE_CHECKING:
    from schedtrace.tracer.contract.traceset import RankTrace, TracePart

_PART_NAME: Final = re.compile(r"\.part(\d+)\.trace$")


def ordered_parts(run: str, parts: list[TracePart]) -> list[TracePart]:
    """One rank's parts in order, checked: one process, no duplicate, no gap, pass numbers continuing."""
    parts = sorted(parts, key=lambda p: (p.header.part, str(p.path)))
    label = rank_label(parts[0].header)
    for before, part in zip(parts, parts[1:]):
        h, b = part.header, before.header
        if (h.host, h.pid, h.start_wall_ns) != (b.host, b.pid, b.start_wall_ns):
            raise TraceSetError(part.path, f"claims rank {label} of run {shown(run)}, as {before.path} does, "
                                f"but from another process (pid {h.pid} vs {b.pid})")
        if h.part == b.part:
            raise TraceSetError(part.path, f"is part {h.part} of rank {label}, as {before.path} is")
        if h.part != b.part + 1:
            raise TraceSetError(_part_name(before.path, b.part + 1),
                                f"missing: part {b.part + 1} of rank {label} (between {before.path.name} "
                                f"and {part.path.name})")
        end = b.first_pass + before.passes()
        if h.first_pass != end:
            raise TraceSetError(part.path, f"part {h.part} starts at pass {h.first_pass}, but part {b.part} "
                                f"({before.path.name}) ends before pass {end}: parts out of order or from "
                                "another recording")
    return parts


def _part_name(neighbour: Path, part: int) -> str:
    """The file name the recorder gives part ``part`` of the rank ``neighbour`` belongs to."""
    match = _PART_NAME.search(neighbour.name)
    if match is None:
        return f"part {part} of {neighbour.parent}"
    return str(neighbour.with_name(neighbour.name[: match.start()] + f".part{part:03d}.trace"))


def missing_ranks(run: str, ranks: list[RankTrace]) -> Iterator[str]:
    """The tp ranks (of tp_size) a stage should have and has not: per DP group under plain DP, where
    each group numbers its own; over the stage under DP attention, where tp ranks span the groups."""
    groups: dict[tuple[int, int], set[int]] = {}
    for r in ranks:
        dp = r.key.dp if r.header.attn_dp_size <= 1 else -1
        groups.setdefault((r.key.pp, dp), set()).add(r.key.tp)
    size = ranks[0].header.tp_size
    for (pp, dp), present in sorted(groups.items()):
        missing = sorted(set(range(size)) - present)
        if missing and len(ranks) > 1:
            where = f"pp {pp}" + (f", dp {dp}" if dp >= 0 else "")
            yield (f"run {shown(run)}: tp rank(s) {', '.join(map(str, missing[:16]))} of tp_size {size} "
                   f"({where}) are not in the set")
