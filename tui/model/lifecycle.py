"""One request's life over the passes that mention it, and why it waited."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Pass
from schedtrace.tui.model.durations import humanize_ns
from schedtrace.tui.model.rids import RidSpan, short_rid


@dataclass(frozen=True)
class LifeStep:
    first: int  # pass range this state held over
    last: int
    state: str  # "waiting", "admitted", "chunk", "running", "arrived", "finished", ...
    detail: str

    def passes_text(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}–{self.last}"


def _why_waiting(p: Pass, rid: str, position: int, max_running: int | None) -> str:
    for c in p.candidates:
        if c.rid == rid:
            if c.result == "NO_TOKEN":
                return f"tried: NO_TOKEN (free {p.kv.available} + evictable {p.kv.evictable} too small)"
            return f"tried: {c.result}"
    if p.error:
        return f"pass raised: {p.error}"
    if p.batch_is_full_in:
        return "not tried: batch_is_full was latched"
    rejected = next((c for c in p.candidates if c.result != "CONTINUE"), None)
    if rejected is not None:
        return f"not tried: {short_rid(rejected.rid)} ahead of it got {rejected.result}"
    if max_running is not None and len(p.running) >= max_running:
        return f"not tried: running batch full ({len(p.running)}/{max_running})"
    if p.req_slots_free <= 0:
        return "not tried: no free request slot"
    if p.admitted:
        return f"not reached: prefill budget used by {len(p.admitted)} admitted (queue position {position + 1})"
    if p.chunk is not None and p.chunk.size:
        return f"not reached: prefill budget used by the continuing chunk of {short_rid(p.chunk.rid)}"
    return f"not reached (queue position {position + 1})"


def request_life(rid: str, passes: Iterable[tuple[int, Pass]], span: RidSpan | None = None,
                 max_running: int | None = None) -> list[LifeStep]:
    """The life of one request over (pass number, pass) pairs (ascending), consecutive equal states folded."""
    steps: list[LifeStep] = []
    if span is not None and span.arrival_ns is not None:
        steps.append(LifeStep(span.first_pass, span.first_pass, "arrived", f"at {humanize_ns(span.arrival_ns)}"))

    def push(n: int, state: str, detail: str) -> None:
        if steps and steps[-1].state == state and steps[-1].detail == detail and steps[-1].last == n - 1:
            last = steps[-1]
            steps[-1] = LifeStep(last.first, n, state, detail)
        else:
            steps.append(LifeStep(n, n, state, detail))

    for n, p in passes:
        admitted = next((a for a in p.admitted if a.rid == rid), None)
        if admitted is not None:
            chunked = " (chunked: more to come)" if p.new_chunked_rid == rid else ""
            push(n, "admitted", f"prefix {admitted.prefix_len}, extend {admitted.extend_len}{chunked}")
            continue
        if p.chunked is not None and p.chunked.rid == rid:
            c = p.chunk
            if c is None or c.size is None:
                budget = "-" if c is None else c.budget
                push(n, "chunk", f"continuing chunk deferred (budget {budget}, {p.chunked.prefix_len}/"
                                 f"{p.chunked.input_len} done)")
            else:
                push(n, "chunk", f"chunk of {c.size} (budget {c.budget}, {p.chunked.prefix_len}/"
                                 f"{p.chunked.input_len} done)")
            continue
        position = next((i for i, w in enumerate(p.waiting) if w.rid == rid), -1)
        if position >= 0:
            push(n, "waiting", _why_waiting(p, rid, position, max_running))
            continue
        if any(r.rid == rid for r in p.running):
            push(n, "running", "decoding")
    if span is not None and span.finish is not None:
        steps.append(LifeStep(span.last_pass, span.last_pass, "finished", span.finish))
    return steps


def mentions(p: Pass, rid: str) -> bool:
    """``rid`` is waiting, running, the chunked request or admitted in ``p``."""
    return (
        any(w.rid == rid for w in p.waiting)
        or any(r.rid == rid for r in p.running)
        or (p.chunked is not None and p.chunked.rid == rid)
        or any(a.rid == rid for a in p.admitted)
    )


def find_rid_passes(reader: TraceReader, rid: str, start: int, stop: int,
                    cancelled: Callable[[], bool] = lambda: False) -> Iterator[tuple[int, Pass]]:
    """(pass number, pass) for the passes in [start, stop] that mention ``rid``."""
    for n, p in enumerate(reader.passes(start, stop + 1), start):
        if n % 1000 == 0 and cancelled():
            return
        if mentions(p, rid):
            yield n, p
