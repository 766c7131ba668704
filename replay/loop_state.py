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

Hybrid traces evolve every pool (``schedtrace.replay.loop_pools``): the SWA
side and the mamba state slots are held per request beside the full KV,
each admission must fit every pool, and ``pool_totals`` (free + evictable +
held, per pool) never changes: the closed loop checks that on every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import msgspec

from schedtrace.replay.loop_pools import (  # ceil_page: re-exported
    FULL_POOL, LoopPools, StepPools, ceil_page, hold, release, slide_swa, swa_window_tokens,
)
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
    swa_held: int = 0  # page-rounded tokens held on the SWA side (paged SWA pools)
    mamba_held: int = 0  # mamba state slots held (the state and its tracking buffers)

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
    # Hybrid pools (None: the model has none): paged SWA tokens, mamba state slots.
    swa_free: int | None = None
    swa_evictable: int | None = None
    mamba_free: int | None = None
    mamba_evictable: int | None = None

    def copy(self) -> LoopState:
        return replace(
            self,
            waiting=[replace(r) for r in self.waiting],
            running=[replace(r) for r in self.running],
            chunked=replace(self.chunked) if self.chunked is not None else None,
        )

    def requests(self) -> list[LoopReq]:
        chunked = [self.chunked] if self.chunked is not None else []
        return [*self.waiting, *self.running, *chunked]

    def pool_totals(self) -> dict[str, int]:
        """Free + evictable + held of every pool: a step moves units, never makes or loses them."""
        reqs = self.requests()
        totals = {"full": self.free + self.evictable + sum(r.kv_held for r in reqs)}
        if self.swa_free is not None:
            totals["swa"] = self.swa_free + (self.swa_evictable or 0) + sum(r.swa_held for r in reqs)
        if self.mamba_free is not None:
            totals["mamba"] = self.mamba_free + (self.mamba_evictable or 0) + sum(r.mamba_held for r in reqs)
        return totals

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
            self.swa_free,
            self.swa_evictable,
            self.mamba_free,
            self.mamba_evictable,
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
    kv_shortfall: int = 0  # tokens the admission asked beyond free + evictable (the SWA side's too)
    mamba_shortfall: int = 0  # mamba state slots it asked beyond free + evictable


# ----------------------------------------------------------------- to Pass


def to_pass(
    state: LoopState,
    *,
    seq: int,
    t_ns: int,
    new_token_ratio: float,
    chunked_prefill_size: int | None,
    pools: LoopPools = FULL_POOL,
) -> Pass:
    """The synthetic pass record of ``state`` (inputs only; outputs empty)."""
    chunked = state.chunked
    swa_free, swa_evictable = state.swa_free, state.swa_evictable
    if pools.swa_ring_cost:  # a ring per request slot: what SWATokenToKVPoolAllocator reports
        swa_free, swa_evictable = state.req_slots_free * pools.swa_ring_cost, 0
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
        kv=KvSnapshot(
            available=state.free,
            evictable=state.evictable,
            swa_available=swa_free,
            swa_evictable=swa_evictable,
            mamba_available=state.mamba_free,
            mamba_evictable=state.mamba_evictable,
        ),
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
    pools: LoopPools = FULL_POOL,
) -> tuple[LoopState, StepResult]:
    """The state at the next pass's entry after ``decision`` and one forward step."""
    state = state.copy()
    result = StepResult()
    step = StepPools.of(state, pools, page_size, radix_cache)
    prefilled: list[LoopReq] = []  # prefills completed this pass: they run from the next pass

    need, extends = _admission_need(state, decision, page_size)
    # The SWA side pages the same new pages; each new request takes its mamba slots.
    slots = len(extends) * pools.mamba_slots_per_req
    shortfall = step.kv.shortfall(need)
    if step.swa is not None:
        shortfall = max(shortfall, step.swa.shortfall(need))
    mamba_shortfall = step.mamba.shortfall(slots) if step.mamba is not None else 0
    if decision.error is not None:
        result.failed = True
    elif decision.over_ask > 0 or shortfall or mamba_shortfall:
        result.failed = True
        result.kv_shortfall = max(decision.over_ask, shortfall)
        result.mamba_shortfall = mamba_shortfall
    else:
        state.batch_is_full = decision.batch_is_full
        _advance_chunk(state, decision, step, prefilled)
        _admit(state, decision, extends, step, prefilled, result)

    decoding = state.running
    state.running = []
    shrank = _decode(state, decoding, step, result)
    for req in prefilled:
        req.output_len += 1  # the prefill's forward samples the first token
        state.running.append(req)
    for req in decoding + prefilled:
        if req in state.running and req.output_len >= req.target_output:
            state.running.remove(req)
            release(req, step, cached=radix_cache)
            state.req_slots_free += 1
            result.finished.append(req.rid)
            shrank = True
    if shrank:
        state.batch_is_full = False  # sglang clears the latch whenever the batch shrinks
    step.store(state)
    return state, result


def _advance_chunk(state: LoopState, decision: Decision, step: StepPools, prefilled: list[LoopReq]) -> None:
    chunked = state.chunked
    if chunked is None or not decision.chunk_size:
        return
    if not step.radix_cache:
        slide_swa(chunked, chunked.prefix_len, step, interval=0)  # extend eviction without prefix sharing
    chunked.prefix_len += decision.chunk_size
    hold(chunked, chunked.prefix_len, step)
    if chunked.prefix_len >= chunked.fill_len:
        prefilled.append(chunked)
        state.chunked = None


def _admit(
    state: LoopState,
    decision: Decision,
    extends: dict[str, int],
    step: StepPools,
    prefilled: list[LoopReq],
    result: StepResult,
) -> None:
    by_rid = {r.rid: r for r in state.waiting}
    page_size = step.page_size
    for rid, extend in extends.items():
        req = by_rid[rid]
        state.waiting.remove(req)
        state.req_slots_free -= 1
        result.admitted.append(rid)
        # The matched prefix is pinned: it leaves the evictable counts.
        cached = ceil_page(req.prefix_len, page_size)
        req.kv_held = step.kv.pin(cached)
        window = step.pools.swa_window
        if step.swa is not None and window is not None:
            req.swa_held = step.swa.pin(swa_window_tokens(cached, window, page_size))
        if step.mamba is not None:
            req.mamba_held = step.pools.mamba_slots_per_req
            step.mamba.take(req.mamba_held)
        req.prefix_len += extend
        hold(req, req.prefix_len, step)
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


def _decode(state: LoopState, decoding: list[LoopReq], step: StepPools, result: StepResult) -> bool:
    """One decode token for each of ``decoding``; retract until it fits. True if any left."""
    if not decoding:
        return False
    page_size = step.page_size

    def growth(reqs: list[LoopReq]) -> int:
        return sum(ceil_page(r.kv_tokens + 1, page_size) - r.kv_held for r in reqs)

    def fits(tokens: int) -> bool:
        return step.kv.fits(tokens) and (step.swa is None or step.swa.fits(tokens))

    # sglang's retraction order: fewest outputs first, then the longest prompt;
    # at least one request always stays.
    keep = sorted(decoding, key=lambda r: (r.output_len, -r.input_len), reverse=True)
    retracted: list[LoopReq] = []
    while len(keep) > 1 and not fits(growth(keep)):
        retracted.append(keep.pop())
    for req in retracted:
        release(req, step, cached=False)
        req.kv_tokens = 0
        req.prefix_len = 0
        state.req_slots_free += 1
        state.waiting.append(req)
        result.retracted.append(req.rid)
    kept = [r for r in decoding if r not in retracted]
    for req in kept:
        if fits(ceil_page(req.kv_tokens + 1, page_size) - req.kv_held):
            hold(req, req.kv_tokens + 1, step)
            req.output_len += 1
        slide_swa(req, req.kv_tokens, step, step.pools.swa_eviction_interval)
        state.running.append(req)
    return bool(retracted)
