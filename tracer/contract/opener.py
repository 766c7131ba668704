"""``open_trace``: one rank's trace from a file, a rank's parts, a glob or a directory.

The Python API's way in (``schedtrace.open_trace``, docs/api.md): what the
commands call a trace set, narrowed to the one rank a script reads. The
result is a ``RankTrace`` (the ``TraceReader`` interface over every part of
the rank, in order) that is also a context manager, so a notebook can write
``with open_trace("traces/") as trace:``. Several ranks or runs in the files
need ``rank=`` or ``run=``, as ``--rank`` and ``--run`` do on the command line.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from schedtrace.tracer.contract.traceset import RankTrace, TraceSet, open_traceset

PathOrSet = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


class Trace(RankTrace):
    """One rank's trace, read as one (``RankTrace``); ``with`` closes its files."""

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trace(path_or_set: PathOrSet, *, rank: str | None = None, run: str | None = None,
               skip_damaged: bool = False) -> Trace:
    """Open the one rank that ``path_or_set`` (a path, a glob, a directory, or a list of them) holds.

    ``rank`` (``tp3``, ``dp1.tp3`` or a bare tp rank) and ``run`` (a run id or a prefix) choose
    among several; ``skip_damaged`` reads on past unreadable regions (``gaps`` lists them), as
    ``info`` and ``replay`` do. Raises ``TraceNotFoundError``, ``TraceFormatError`` or
    ``TraceSetError`` (all ``SchedtraceError``) with one line saying what is wrong.
    """
    many = [path_or_set] if isinstance(path_or_set, (str, os.PathLike)) else list(path_or_set)
    with open_traceset(many, skip_damaged=skip_damaged) as traces:  # headers only: no file stays open
        chosen = traces.rank(rank, run)
    return Trace(label=chosen.label, key=chosen.key, parts=list(chosen.parts))


__all__ = ["PathOrSet", "Trace", "TraceSet", "open_trace", "open_traceset"]
