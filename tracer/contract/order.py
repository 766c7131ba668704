"""``Pass.order``: the queue order ``calc_priority`` produced, as runs over the pass's waiting rows.

A permutation of ``n`` rows is written as pairs ``(start, count)``: the rows
``start .. start+count-1`` of the entry order, in that order, then the next
run. The entry order itself is ``None``, and a queue sorted by a key that
mostly keeps the order (lpm after its first sort, priorities) is a few runs;
a random shuffle is one run per row. A file's runs are untrusted: anything
but a permutation of the rows is ``OrderError``.
"""

from __future__ import annotations

from collections.abc import Sequence


class OrderError(ValueError):
    """Runs that are not a permutation of the pass's waiting rows."""


def order_runs(perm: Sequence[int]) -> list[int] | None:
    """The runs of ``perm`` (entry indexes in queue order); None for the identity."""
    out: list[int] = []
    start = prev = -2
    for i in perm:
        if i == prev + 1:
            prev = i
            continue
        if start >= 0:
            out += (start, prev - start + 1)
        start = prev = i
    if start >= 0:
        out += (start, prev - start + 1)
    if len(out) == 2 and out[0] == 0:
        return None
    return out or None


def order_indexes(runs: Sequence[int] | None, n: int) -> list[int]:
    """Entry indexes in queue order for ``runs`` over ``n`` rows (the identity for None)."""
    if runs is None:
        return list(range(n))
    if len(runs) % 2:
        raise OrderError("order runs are not (start, count) pairs")
    out: list[int] = []
    for k in range(0, len(runs), 2):
        start, count = runs[k], runs[k + 1]
        if start < 0 or count <= 0 or start + count > n or len(out) + count > n:
            raise OrderError(f"order run {k // 2} takes rows {start}..{start + count} of {n}")
        out.extend(range(start, start + count))
    if len(out) != n or len(set(out)) != n:
        raise OrderError(f"order runs take {len(out)} rows ({len(set(out))} distinct) of {n}")
    return out


def in_order(rows: list, runs: Sequence[int] | None) -> list:
    """``rows`` (a pass's waiting rows, entry order) in the order ``runs`` says."""
    if runs is None:
        return list(rows)
    return [rows[i] for i in order_indexes(runs, len(rows))]
