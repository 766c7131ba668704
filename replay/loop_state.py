"""The scheduler state a closed-loop replay evolves, and how one pass moves it.

Pure: no sglang, no I/O. A ``LoopState`` is what a recorded ``Pass`` holds
at entry (queue, running batch, chunked request, the ``batch_is_full`` latch,
free and evictable KV, free request slots) plus what the loop needs to move
it forward (each request's KV held and the output length at which it
finishes). ``to_pass`` turns it into the ``Pass`` the driver decides on;
``apply_decision`` applies one ``Decision`` and one forward step:

* admission allocates the page-rounded extend (evicting when free runs out)
  and takes a request slot; a cached prefix leaves the evictable count;
* the continuing chunk and a new chunk advance the chunked request; a
  request whose prefill completes produces its first token and runs; so
  does an unfinished new chunk the scheduler does not track (a second new
  chunk in one pass): sglang commits its output on part of its prompt;
* every request running at pass entry decodes one token (page growth);
  when that does not fit, requests are retracted in sglang's order;
* a request that reaches its recorded output length finishes: its KV
  becomes evictable (free without a radix cache), its slot frees, and the
  running batch shrinking clears ``batch_is_full`` as sglang does.

A pass that raised, or whose allocation cannot be met, admits nothing
(the real allocator would have failed it); decode still runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import msgspec

from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import (
    Admitted,
    ChunkedReq,
    ChunkOutcome,
    KvSnapshot,
    Pass,
    RunningReq,
    WaitingReq,
)


@dataclass(eq=False)  # identity: two requests are never "equal"
class LoopReq:
    rid: str
    input_len: int
    max_new_tokens: int
    target_output: int  # output length at which it finishes (recorded Finish)
    output_len: int = 0
    prefix_len: int = 0  # waiting: cached prefix; chunked: tokens prefilled
    kv_tokens: int = 0  # tokens in KV (seq length held)
    kv_held: int = 0  # page-rounded tokens held
    priority: int | None = None
    ignore_eos: bool = False

    @property
    def fill_len(self) -> int:
        """Tokens a prefill must cover: the prompt plus outputs kept by a retraction."""
        return self.input_len + self.output_len


@dataclass
class LoopState:
    waiting: list[LoopReq]
    running: list[LoopReq]
    chunked: LoopReq | None
    batch_is_full: bool
    free: int
    evictable: int
    req_slots_free: int

    def copy(self) -> LoopState:
        return LoopState(
            waiting=[replace(r) for r in self.waiting],
            running=[replace(r) for r in self.running],
            chunked=replace(self.chunked) if self.chunked is not None else None,
            batch_is_full=self.batch_is_full,
            free=self.free,
            evictable=self.evictable,
            req_slots_free=self.req_slots_free,
        )

    def signature(self) -> tuple:
        """Everything a decision depends on; equal signatures give equal decisions."""

        def key(r: LoopReq) -> tuple:
            return (r.rid, r.input_len, r.output_len, r.prefix_len, r.kv_held, r.max_new_tokens)

        return (
            tuple(key(r) for r in self.waiting),
            tuple(key(r) for r in self.running),
            key(self.chunked) if self.chunked is not None else None,
            self.batch_is_full,
            self.free,
            self.evictable,
            self.req_slots_free,
        )

    @property
    def is_idle(self) -> bool:
        """Nothing to admit: sglang's pass returns at once without touching state."""
        return not self.waiting and self.chunked is None


@dataclass
class StepResult:
    """What one pass did, for the per-arm counters."""

    admitted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    retracted: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # ran on part of the prompt (untracked chunk)
    failed: bool = False  # raised or could not allocate: admitted nothing
    kv_shortfall: int = 0  # tokens the admission asked beyond free + evictable


def ceil_page(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size) * page_size


# ----------------------------------------------------------------- to Pass


def to_pass(
    state: LoopState,
    *,
    seq: int,
    t_ns: int,
    new_token_ratio: float,
    chunked_prefill_size: int | None,
) -> Pass:
    """The synthetic pass record of ``state`` (inputs only; outputs empty)."""
    chunked = state.chunked
    return Pass(
        seq=seq,
        t_ns=t_ns,
        dur_ns=0,
        repeat=1,
        idle_before=0,
        waiting=[
            WaitingReq(
                rid=r.rid,
                input_len=r.input_len,
                output_len=r.output_len,
                max_new_tokens=r.max_new_tokens,
                prefix_len=r.prefix_len,
                priority=r.priority,
                ignore_eos=r.ignore_eos,
            )
            for r in state.waiting
        ],
        running=[
            RunningReq(
                rid=r.rid,
                input_len=r.input_len,
                output_len=r.output_len,
                max_new_tokens=r.max_new_tokens,
                ignore_eos=r.ignore_eos,
            )
            for r in state.running
        ],
        chunked=(
            ChunkedReq(
                rid=chunked.rid,
                input_len=chunked.input_len,
                prefix_len=chunked.prefix_len,
                max_new_tokens=chunked.max_new_tokens,
                output_len=chunked.output_len,
                ignore_eos=chunked.ignore_eos,
            )
            if chunked is not None
            else None
        ),
        batch_is_full_in=state.batch_is_full,
        kv=KvSnapshot(available=state.free, evictable=state.evictable),
        req_slots_free=state.req_slots_free,
        new_token_ratio=new_token_ratio,
        chunked_prefill_size=chunked_prefill_size,
        candidates=[],
        admitted=[],
        chunk=None,
        new_chunked_rid=None,
        batch_is_full_out=state.batch_is_full,
    )


def with_outputs(p: Pass, decision: Decision, state_before: LoopState) -> Pass:
    """``p`` with its output fields filled from ``decision`` (for reading back)."""
    prefix = {r.rid: r.prefix_len for r in state_before.waiting}
    chunk = None
    if state_before.chunked is not None:
        chunk = ChunkOutcome(
            rid=state_before.chunked.rid, budget=decision.chunk_budget, size=decision.chunk_size
        )
    return replace_pass(
        p,
        admitted=[Admitted(rid=rid, prefix_len=prefix.get(rid, 0), extend_len=n) for rid, n in decision.admitted],
        chunk=chunk,
        new_chunked_rid=decision.new_chunked_rid,
        batch_is_full_out=decision.batch_is_full,
        error=decision.error,
    )


def replace_pass(p: Pass, **changes) -> Pass:
    return msgspec.structs.replace(p, **changes)


# ------------------------------------------------------------- evolution


class _Kv:
    """Free and evictable KV; allocation evicts when free runs out."""

    def __init__(self, free: int, evictable: int) -> None:
        self.free = free
        self.evictable = evictable

    def fits(self, tokens: int) -> bool:
        return tokens <= self.free + self.evictable

    def take(self, tokens: int) -> None:
        if tokens > self.free:
            evict = tokens - self.free
            self.evictable -= evict
            self.free += evict
        self.free -= tokens


def _admission_need(state: LoopState, decision: Decision, page_size: int) -> tuple[int, dict[str, int]]:
    """Tokens the pass allocates, and each admitted request's extend."""
    by_rid = {r.rid: r for r in state.waiting}
    extends: dict[str, int] = {}
    need = 0
    chunked = state.chunked
    chunk_size = decision.chunk_size or 0
    if chunked is not None and chunk_size > 0:
        need += ceil_page(chunked.prefix_len + chunk_size, page_size) - chunked.kv_held
    for rid, extend in decision.admitted:
        if chunked is not None and rid == chunked.rid:
            continue  # the continuing chunk, sized above
        req = by_rid.get(rid)
        if req is None or extend <= 0:
            continue
        extends[rid] = extend
        need += ceil_page(req.prefix_len + extend, page_size) - ceil_page(req.prefix_len, page_size)
    return max(need, 0), extends


def apply_decision(
    state: LoopState,
    decision: Decision,
    *,
    page_size: int,
    radix_cache: bool,
) -> tuple[LoopState, StepResult]:
    """The state at the next pass's entry after ``decision`` and one forward step."""
    state = state.copy()
    result = StepResult()
    kv = _Kv(state.free, state.evictable)
    prefilled: list[LoopReq] = []  # prefills completed this pass: they run from the next pass

    need, extends = _admission_need(state, decision, page_size)
    if decision.error is not None:
        result.failed = True
    elif decision.over_ask > 0 or not kv.fits(need):
        result.failed = True
        result.kv_shortfall = max(decision.over_ask, need - kv.free - kv.evictable)
    else:
        state.batch_is_full = decision.batch_is_full
        _advance_chunk(state, decision, kv, page_size, prefilled)
        _admit(state, decision, extends, kv, page_size, prefilled, result)

    decoding = state.running
    state.running = []
    shrank = _decode(state, decoding, kv, page_size, result)
    for req in prefilled:
        req.output_len += 1  # the prefill's forward samples the first token
        state.running.append(req)
    for req in decoding + prefilled:
        if req in state.running and req.output_len >= req.target_output:
            state.running.remove(req)
            _release(req, kv, radix_cache)
            state.req_slots_free += 1
            result.finished.append(req.rid)
            shrank = True
    if shrank:
        state.batch_is_full = False  # sglang clears the latch whenever the batch shrinks
    state.free, state.evictable = kv.free, kv.evictable
    return state, result


def _advance_chunk(state: LoopState, decision: Decision, kv: _Kv, page_size: int, prefilled: list[LoopReq]) -> None:
    chunked = state.chunked
    if chunked is None or not decision.chunk_size:
        return
    chunked.prefix_len += decision.chunk_size
    _hold(chunked, chunked.prefix_len, kv, page_size)
    if chunked.prefix_len >= chunked.fill_len:
        prefilled.append(chunked)
        state.chunked = None


def _admit(
    state: LoopState,
    decision: Decision,
    extends: dict[str, int],
    kv: _Kv,
    page_size: int,
    prefilled: list[LoopReq],
    result: StepResult,
) -> None:
    by_rid = {r.rid: r for r in state.waiting}
    for rid, extend in extends.items():
        req = by_rid[rid]
        state.waiting.remove(req)
        state.req_slots_free -= 1
        result.admitted.append(rid)
        # The matched prefix is pinned: it leaves the evictable count.
        cached = min(ceil_page(req.prefix_len, page_size), kv.evictable)
        kv.evictable -= cached
        req.kv_held = cached
        req.prefix_len += extend
        _hold(req, req.prefix_len, kv, page_size)
        if req.prefix_len >= req.fill_len:
            prefilled.append(req)
        elif rid == decision.new_chunked_rid:
            state.chunked = req  # the adder's new chunked request
        else:
            # An unfinished chunk the scheduler does not track (a later new
            # chunk took the one chunked_req slot): sglang commits its output
            # as if the prefill were done, so it runs on part of its prompt.
            prefilled.append(req)
            result.truncated.append(rid)


def _hold(req: LoopReq, tokens: int, kv: _Kv, page_size: int) -> None:
    held = ceil_page(tokens, page_size)
    if held > req.kv_held:
        kv.take(held - req.kv_held)
        req.kv_held = held
    req.kv_tokens = tokens


def _decode(state: LoopState, decoding: list[LoopReq], kv: _Kv, page_size: int, result: StepResult) -> bool:
    """One decode token for each of ``decoding``; retract until it fits. True if any left."""
    if not decoding:
        return False

    def growth(reqs: list[LoopReq]) -> int:
        return sum(ceil_page(r.kv_tokens + 1, page_size) - r.kv_held for r in reqs)

    # sglang's retraction order: fewest outputs first, then the longest prompt;
    # at least one request always stays.
    keep = sorted(decoding, key=lambda r: (r.output_len, -r.input_len), reverse=True)
    retracted: list[LoopReq] = []
    while len(keep) > 1 and not kv.fits(growth(keep)):
        retracted.append(keep.pop())
    for req in retracted:
        kv.free += req.kv_held
        req.kv_held = req.kv_tokens = 0
        req.prefix_len = 0
        state.req_slots_free += 1
        state.waiting.append(req)
        result.retracted.append(req.rid)
    kept = [r for r in decoding if r not in retracted]
    for req in kept:
        if kv.fits(ceil_page(req.kv_tokens + 1, page_size) - req.kv_held):
            _hold(req, req.kv_tokens + 1, kv, page_size)
            req.output_len += 1
        state.running.append(req)
    return bool(retracted)


def _release(req: LoopReq, kv: _Kv, radix_cache: bool) -> None:
    if radix_cache:
        kv.evictable += req.kv_held
    else:
        kv.free += req.kv_held
    req.kv_held = 0
