"""Pure stall detection over passes and the decisions an arm made on them.

A stall is a run of at least ``min_passes`` consecutive passes where requests
wait, a request slot is free (the running batch is below
``max_running_requests`` and the request pool has a free row), the free +
evictable KV would fit the head request, and nothing is admitted (no new
request, no continuing chunk).

"Would fit" uses the scheduler's own estimate, so that ordinary
back-pressure is not called a stall: the head's uncached tokens plus its
decode reservation, on top of the decode tokens the running requests still
reserve (``min(max_new_tokens - output_len, CLIP)``, times the new-token ratio
unless ``ignore_eos``). Folded records count ``repeat`` passes; idle
passes between records (nothing waiting) end a run.

This is the one definition: replay, closed loop, bisect, ``info``, the TUI and
the exporters all use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Decision, Stall
from schedtrace.tracer.contract.schema import Pass

# sglang's CLIP_MAX_NEW_TOKENS, read from the same variable with the same default.
CLIP_MAX_NEW_TOKENS = int(os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", 4096))


def has_free_slot(p: Pass, max_running: int | None) -> bool:
    return p.req_slots_free > 0 and (max_running is None or len(p.running) < max_running)


def _decode_left(max_new_tokens: int, output_len: int) -> int:
    return min(max(max_new_tokens - output_len, 0), CLIP_MAX_NEW_TOKENS)


def head_fits(p: Pass) -> bool:
    """The head request and every running request's decode fit in free + evictable KV."""
    if not p.waiting:
        return False
    head = p.waiting[0]
    need = head.input_len + head.output_len - head.prefix_len + _decode_left(head.max_new_tokens, head.output_len)
    ratio = p.new_token_ratio
    reserved = sum(
        _decode_left(r.max_new_tokens, r.output_len) * (1.0 if r.ignore_eos else ratio) for r in p.running
    )
    return need + reserved <= p.kv.available + p.kv.evictable


def is_stalled(p: Pass, d: Decision, max_running: int | None = None) -> bool:
    """Requests wait with room for the head, and nothing got in."""
    if d.admitted or d.chunk_size is not None:
        return False
    return head_fits(p) and has_free_slot(p, max_running)


class StallScanner:
    """Incremental ``find_stalls``: feed passes in order, then ``finish``."""

    def __init__(self, min_passes: int, max_running: int | None = None) -> None:
        if min_passes < 1:
            raise ValueError("min_passes must be at least 1")
        self.min_passes = min_passes
        self.max_running = max_running
        self.stalls: list[Stall] = []
        self._start: int | None = None
        self._end = 0
        self._count = 0
        self._head: str | None = None

    @property
    def open_run_start(self) -> int | None:
        """First pass of the stalled run in progress, if any."""
        return self._start

    def feed_pass(self, p: Pass, d: Decision, seq: int | None = None) -> bool:
        """Feed one pass under one arm's decision; returns whether it stalled."""
        stalled = is_stalled(p, d, self.max_running)
        head = p.waiting[0].rid if p.waiting else None
        self.feed(p.seq if seq is None else seq, p.repeat, p.idle_before, stalled, head)
        return stalled

    def feed(self, seq: int, repeat: int, idle_before: int, stalled: bool, head_rid: str | None) -> None:
        if self._start is not None and (idle_before > 0 or not stalled):
            self._close()
        if not stalled:
            return
        if self._start is None:
            self._start, self._count, self._head = seq, 0, head_rid
        self._end = seq
        self._count += max(repeat, 1)

    def _close(self) -> None:
        if self._start is not None and self._count >= self.min_passes:
            self.stalls.append(
                Stall(start_pass=self._start, end_pass=self._end, passes=self._count, head_rid=self._head)
            )
        self._start = None

    def finish(self) -> list[Stall]:
        self._close()
        return self.stalls


def find_stalls(
    passes: Sequence[Pass],
    decisions: Sequence[Decision],
    min_passes: int,
    max_running: int | None = None,
) -> list[Stall]:
    """Stalls of one arm; ``decisions[i]`` is the arm's decision on ``passes[i]``."""
    if len(passes) != len(decisions):
        raise ValueError(f"{len(passes)} passes but {len(decisions)} decisions")
    scanner = StallScanner(min_passes, max_running)
    for p, d in zip(passes, decisions):
        scanner.feed_pass(p, d)
    return scanner.finish()


def recorded_stalls(passes: Iterable[Pass], min_passes: int, max_running: int | None) -> list[Stall]:
    """Stalls in what the recording itself decided."""
    scanner = StallScanner(min_passes, max_running)
    for p in passes:
        scanner.feed_pass(p, recorded_decision(p))
    return scanner.finish()
