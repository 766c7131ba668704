"""Delta debugging, pure: the smallest list and the roundest number a predicate still holds for.

``ddmin`` is Zeller's minimising delta debugging: it returns a 1-minimal
sublist (removing any one item breaks the predicate), in the items' order.
``shrink_int`` finds a small, round value. Both are deterministic: the same
input and predicate give the same answer and the same sequence of calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def _split(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    parts, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        parts.append(items[start:end])
        start = end
    return parts


def ddmin(items: Sequence[T], holds: Callable[[list[T]], bool]) -> list[T]:
    """A 1-minimal sublist of ``items`` for which ``holds`` is true.

    ``holds(list(items))`` must be true. Subsets are tried before complements,
    each in order, so the earliest items are kept when several would do.
    """
    current = list(items)
    if current and holds([]):
        return []
    n = 2
    while len(current) >= 2:
        parts = _split(current, n)
        reduced = next((part for part in parts if holds(part)), None)
        if reduced is not None:
            current, n = reduced, 2
            continue
        if n > 2:  # with two parts a complement is the other part, already tried
            complements = ([x for other in parts if other is not part for x in other] for part in parts)
            reduced = next((c for c in complements if holds(c)), None)
            if reduced is not None:
                current, n = reduced, max(n - 1, 2)
                continue
        if n >= len(current):
            break
        n = min(2 * n, len(current))
    return current


def round_values_below(value: int) -> list[int]:
    """0, 1, then every d * 10**k below ``value`` (d in 1..9), ascending."""
    out = [v for v in (0, 1) if v < value]
    scale = 1
    while scale < value:
        out += [d * scale for d in range(2 if scale == 1 else 1, 10) if d * scale < value]
        scale *= 10
    return out


def shrink_int(value: int, holds: Callable[[int], bool]) -> int:
    """The smallest round value below ``value`` that holds; else a bisected one, rounded up.

    ``holds(value)`` is assumed true. The round values are tried ascending;
    if none holds, the least holding value above the largest of them is
    bisected for (as if ``holds`` were monotone there), then rounded up to
    the roundest number that still holds and stays below ``value``.
    """
    below = round_values_below(value)
    found = next((v for v in below if holds(v)), None)
    if found is not None:
        return found
    lo, hi = (below[-1] if below else -1), value
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    scale = 10 ** (len(str(hi)) - 1)
    while scale > 1:
        rounded = -(-hi // scale) * scale
        if hi < rounded < value and holds(rounded):
            return rounded
        scale //= 10
    return hi
