"""Where a trace sits in a server: its run and its ranks, as keys and labels."""

from __future__ import annotations

from typing import Final, NamedTuple

from schedtrace.tracer.contract.schema import Header

SHOWN_TEXT: Final = 40  # characters of a run id or host kept in a message


class RankKey(NamedTuple):
    """Where a scheduler sits in the server: its ranks, in sort order."""

    pp: int
    dp: int
    tp: int


def rank_key(header: Header) -> RankKey:
    return RankKey(header.pp_rank, header.dp_rank or 0, header.tp_rank)


def rank_label(header: Header) -> str:
    """``tp3``; ``dp1.tp3`` with data parallelism, ``pp1.tp3`` with pipeline stages."""
    labels = []
    if header.pp_size > 1 or header.pp_rank:
        labels.append(f"pp{header.pp_rank}")
    if header.dp_size > 1 or header.dp_rank:
        labels.append(f"dp{header.dp_rank or 0}")
    labels.append(f"tp{header.tp_rank}")
    return ".".join(labels)


def run_key(header: Header) -> str:
    """The run a trace belongs to: its run id, or its process for traces without one."""
    return header.run_id or f"{header.host}/pid{header.pid}/{header.start_wall_ns}"


def shown(text: str) -> str:
    """Untrusted header text cut to a length a message can carry."""
    return text if len(text) <= SHOWN_TEXT else text[: SHOWN_TEXT - 1] + "…"
