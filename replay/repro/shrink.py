"""Shrink a divergent pass (or aiter event) while the probe says the divergence survives.

Lists first, by delta debugging (``ddmin``): the waiting queue, the running
batch, the chunked request and the candidates (whose recorded prefix locks
are an input). Then the rids become ``waiting-0``, ``running-0``, ``chunked``,
then every number is made small and round (``shrink_int``) and flags are
cleared, field by field in a fixed order, and the whole is repeated until
nothing changes. A pass's outputs are cleared first: the driver reads only
its inputs. Every step is checked with the real sglang code (the probe), and
the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from schedtrace.replay.repro.ddmin import ddmin, shrink_int
from schedtrace.replay.repro.probe import Subject
from schedtrace.tracer.contract.schema import Aiter, Candidate, Pass

MAX_ROUNDS = 4  # list + number rounds; each round that changes nothing ends the loop

Path = tuple[Any, ...]  # attribute names and list indices from the subject down to one field


def get(obj: Any, path: Path) -> Any:
    for step in path:
        obj = obj[step] if isinstance(step, int) else getattr(obj, step)
    return obj


def put(obj: Any, path: Path, value: Any) -> Any:
    """A copy of ``obj`` with the field at ``path`` set to ``value`` (structs and lists copied on the way)."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    if isinstance(step, int):
        items = list(obj)
        items[step] = put(items[step], rest, value)
        return items
    return msgspec.structs.replace(obj, **{step: put(getattr(obj, step), rest, value)})


def inputs_only(p: Pass) -> Pass:
    """``p`` with its outputs cleared; candidates kept only for their recorded prefix locks."""
    candidates = [
        Candidate(c.rid, c.prefix_len, 0, "", c.locked_evictable, c.locked_swa_evictable)
        for c in p.candidates
        if c.locked_evictable is not None or c.locked_swa_evictable is not None
    ]
    return msgspec.structs.replace(
        p, repeat=1, idle_before=0, candidates=candidates, admitted=[], chunk=None,
        new_chunked_rid=None, batch_is_full_out=False, error=None,
    )


def plausible(p: Pass) -> bool:
    """A state the server could be in: real prompts and limits, no request done yet, the chunked
    request part-way (some tokens prefilled, some not), no prefix longer than its tokens."""
    rows = (*p.waiting, *p.running, *((p.chunked,) if p.chunked is not None else ()))
    if any(r.input_len < 1 or r.max_new_tokens < 1 or r.output_len >= r.max_new_tokens for r in rows):
        return False
    if any(w.prefix_len > w.input_len + w.output_len for w in p.waiting):
        return False
    c = p.chunked
    if c is not None and not 1 <= c.prefix_len < c.input_len + c.output_len:
        return False
    if p.chunked_prefill_size is not None and p.chunked_prefill_size < 1:
        return False
    prefixes = {w.rid: w.prefix_len for w in p.waiting}
    return all((c.locked_evictable or 0) <= prefixes.get(c.rid, c.prefix_len) for c in p.candidates)


def _rename(p: Pass) -> Pass:
    names = {w.rid: f"waiting-{n}" for n, w in enumerate(p.waiting)}
    names.update({r.rid: f"running-{n}" for n, r in enumerate(p.running)})
    if p.chunked is not None:
        names[p.chunked.rid] = "chunked"
    rename = lambda row: msgspec.structs.replace(row, rid=names.get(row.rid, row.rid))  # noqa: E731
    return msgspec.structs.replace(
        p,
        waiting=[rename(w) for w in p.waiting],
        running=[rename(r) for r in p.running],
        chunked=rename(p.chunked) if p.chunked is not None else None,
        candidates=[rename(c) for c in p.candidates if c.rid in names],
    )


def _pass_numbers(p: Pass) -> Iterator[Path]:
    """Every number of a pass's state, in the order they are shrunk (prefixes before their lengths).

    Server options (chunk size, limits) stay as recorded: the test is about that server."""
    yield ("kv", "available")
    yield ("kv", "evictable")
    yield ("req_slots_free",)
    for n in range(len(p.waiting)):
        yield from (("waiting", n, f) for f in ("prefix_len", "output_len", "input_len", "max_new_tokens"))
    for n in range(len(p.running)):
        yield from (("running", n, f) for f in ("output_len", "input_len", "max_new_tokens"))
    if p.chunked is not None:
        yield from (("chunked", f) for f in ("prefix_len", "output_len", "input_len", "max_new_tokens"))
    for n, c in enumerate(p.candidates):
        if c.locked_evictable is not None:
            yield ("candidates", n, "locked_evictable")


def _pass_flags(p: Pass) -> Iterator[tuple[Path, Any]]:
    """Flags and options to clear: (field, the plain value)."""
    for group in ("waiting", "running"):
        for n in range(len(getattr(p, group))):
            yield (group, n, "ignore_eos"), False
    for n in range(len(p.waiting)):
        yield ("waiting", n, "priority"), None
    if p.chunked is not None:
        yield ("chunked", "ignore_eos"), False
    yield ("new_token_ratio",), round(p.new_token_ratio, 1)


def _shrink_lists(p: Pass, holds: Callable[[Pass], bool]) -> Pass:
    for name in ("waiting", "running", "candidates"):
        kept = ddmin(getattr(p, name), lambda items, name=name: holds(msgspec.structs.replace(p, **{name: items})))
        p = msgspec.structs.replace(p, **{name: kept})
    if p.chunked is not None and holds(msgspec.structs.replace(p, chunked=None)):
        p = msgspec.structs.replace(p, chunked=None)
    return p


def _shrink_fields(subject: Subject, numbers: list[Path], flags: list[tuple[Path, Any]], holds) -> Subject:
    for path in numbers:
        value = get(subject, path)
        if value > 0:
            subject = put(subject, path, shrink_int(value, lambda v, path=path: holds(put(subject, path, v))))
    for path, plain in flags:
        if get(subject, path) != plain and holds(put(subject, path, plain)):
            subject = put(subject, path, plain)
    return subject


def shrink_pass(p: Pass, holds: Callable[[Pass], bool]) -> Pass:
    """The smallest pass ``holds`` keeps true, starting from ``p``'s inputs (``holds`` must hold there)."""
    check = lambda q: plausible(q) and holds(q)  # noqa: E731
    p = inputs_only(p)
    if not check(p):
        raise ValueError("the divergence does not hold on the pass's own inputs")
    for round_ in range(MAX_ROUNDS):
        before = p
        p = _shrink_lists(p, check)
        if round_ == 0:
            renamed = _rename(p)
            p = renamed if check(renamed) else p
        p = _shrink_fields(p, list(_pass_numbers(p)), list(_pass_flags(p)), check)
        if p == before:
            break
    return p


def shrink_aiter(event: Aiter, holds: Callable[[Aiter], bool]) -> Aiter:
    """The smallest aiter event ``holds`` keeps true: short sequences, a small capacity, fewer graph flags."""
    check = lambda e: e.max_chunk_capacity >= 1 and e.seq_lens_sum >= 1 and holds(e)  # noqa: E731
    if not check(event):
        raise ValueError("the divergence does not hold on the event itself")
    numbers = [("max_chunk_capacity",), ("seq_lens_sum",)]
    flags = [(("in_breakable_graph",), False), (("in_piecewise_graph",), False)]
    for _ in range(MAX_ROUNDS):
        before = event
        event = _shrink_fields(event, numbers, flags, check)
        if event == before:
            break
    return event


@dataclass(frozen=True)
class Shape:
    """What a summary line says about a subject."""

    waiting: int
    running: int
    chunked: bool
    kv: tuple[int, int]

    @classmethod
    def of(cls, p: Pass) -> Shape:
        return cls(len(p.waiting), len(p.running), p.chunked is not None, (p.kv.available, p.kv.evictable))


def describe(before: Subject, after: Subject) -> str:
    """``"24 waiting, 8 running → 1 waiting, 1 running; kv 315/2980 → 16/0"``."""
    if isinstance(before, Aiter):
        b, a = before, after
        return (f"seq_lens_sum {b.seq_lens_sum} → {a.seq_lens_sum}, "
                f"capacity {b.max_chunk_capacity} → {a.max_chunk_capacity}")
    b, a = Shape.of(before), Shape.of(after)

    def queue(s: Shape) -> str:
        return f"{s.waiting} waiting, {s.running} running" + (", 1 chunked" if s.chunked else "")

    return f"{queue(b)} → {queue(a)}; kv {b.kv[0]}/{b.kv[1]} → {a.kv[0]}/{a.kv[1]}"
