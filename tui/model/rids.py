"""Every request's pass span, arrival and finish, in compact columns."""

from __future__ import annotations

from array import array
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

from schedtrace.tui.model.durations import humanize_ns


@dataclass(slots=True)
class RidSpan:
    first_pass: int
    last_pass: int
    arrival_ns: int | None = None
    finish: str | None = None  # "length @ 1.2s", "abort @ ...", None while unfinished


_NONE: Final = -(2**63)  # "no value" in the int64 columns below
SHORT_RID: Final = 8  # characters of a rid the lists show (why.py's lines cut them the same)


def short_rid(rid: str) -> str:
    """A rid as lists show it; ``/`` finds a request by any unique prefix, this one too."""
    return rid[:SHORT_RID]


class RidIndex:
    """Every rid's pass span, arrival and finish, in columns (a million requests fit in ~100 MB).

    One ``RidSpan`` object per rid costs about three times as much; spans are
    made on demand by ``get``.
    """

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.first_pass = array("q")
        self.last_pass = array("q")
        self.arrival_ns = array("q")
        self.finish_ns = array("q")
        self.finish_reason = array("H")  # index into self._reasons
        self._reasons: list[str] = []
        self._reason_code: dict[str, int] = {}
        self._sorted: list[str] | None = None  # every rid, sorted, for prefix search (see freeze)

    def touch(self, rid: str, n: int) -> None:
        """``rid`` is seen at pass ``n``."""
        i = self._index.get(rid)
        if i is None:
            self._add(rid, n)
        elif n > self.last_pass[i]:
            self.last_pass[i] = n

    def _add(self, rid: str, n: int) -> int:
        i = self._index[rid] = len(self.first_pass)
        self.first_pass.append(n)
        self.last_pass.append(n)
        self.arrival_ns.append(_NONE)
        self.finish_ns.append(_NONE)
        self.finish_reason.append(0)
        return i

    def arrived(self, rid: str, n: int, t_ns: int) -> None:
        i = self._index.get(rid)
        if i is None:
            i = self._add(rid, n)
        self.arrival_ns[i] = t_ns

    def finished(self, rid: str, last_pass: int, reason: str, t_ns: int) -> None:
        """A known rid ended (unknown rids are ignored, as before they were ever seen)."""
        i = self._index.get(rid)
        if i is None:
            return
        self.last_pass[i] = max(self.last_pass[i], last_pass)
        code = self._reason_code.get(reason)
        if code is None:
            code = self._reason_code[reason] = len(self._reasons)
            self._reasons.append(reason)
        self.finish_reason[i] = code
        self.finish_ns[i] = t_ns

    def freeze(self) -> None:
        """The scan is over: sort the rids once (in the scan's thread), so a prefix is a bisect."""
        self._sorted = sorted(self._index)

    def matching(self, prefix: str, limit: int = 6) -> list[str]:
        """Rids that start with ``prefix``, at most ``limit`` (an exact rid alone matches itself)."""
        if prefix in self._index:
            return [prefix]
        keys = self._sorted if self._sorted is not None else sorted(self._index)
        out: list[str] = []
        i = bisect_left(keys, prefix)
        while i < len(keys) and len(out) < limit and keys[i].startswith(prefix):
            out.append(keys[i])
            i += 1
        return out

    def get(self, rid: str) -> RidSpan | None:
        i = self._index.get(rid)
        if i is None:
            return None
        arrival, finish_ns = self.arrival_ns[i], self.finish_ns[i]
        finish = None if finish_ns == _NONE else f"{self._reasons[self.finish_reason[i]]} @ {humanize_ns(finish_ns)}"
        return RidSpan(self.first_pass[i], self.last_pass[i], None if arrival == _NONE else arrival, finish)

    def __getitem__(self, rid: str) -> RidSpan:
        span = self.get(rid)
        if span is None:
            raise KeyError(rid)
        return span

    def __contains__(self, rid: object) -> bool:
        return rid in self._index

    def __len__(self) -> int:
        return len(self._index)
