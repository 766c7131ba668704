"""The scheduler state a closed-loop replay evolves, and how one pass moves it.

Pure: no sglang, no I/O. A ``LoopState`` is what a recorded ``Pass`` holds
at entry (queue, running batch, chunked request, the ``batch_is_full`` latch,
free and evictable KV, free request slots) plus what the loop needs to move
it forward (each request's KV held and the output length at which it
finishes). ``to_pass`` (``schedtrace.replay.loop.records``) turns it into the
``Pass`` the driver decides on; ``apply_decision`` applies one ``Decision``
and one forward step, as ``Scheduler.get_next_batch_to_run`` picks it:

* admission (``schedtrace.replay.loop.admit``) allocates the page-rounded
  extend (evicting when free runs out) and takes a request slot; a cached
  prefix leaves the evictable count, a prefix shared with a running request
  is not allocated again;
* the continuing chunk and a new chunk advance the chunked request; a
  request whose prefill completes produces its first token and runs; so
  does an unfinished new chunk the scheduler does not track (a second new
  chunk in one pass): sglang commits its output on part of its prompt;
* the step's forward is the prefill batch when the pass built one (the
  running batch then decodes nothing, unless mixed chunk mixes it in), else
  the decode: every running request grows one token (page growth); when
  that does not fit, requests are retracted in sglang's order;
* a request that reaches its recorded output length finishes: its KV
  becomes evictable (free without a radix cache), its slot frees, and the
  running batch shrinking clears ``batch_is_full`` as sglang does (so does a
  batch that left a chunk unfinished, filtered out of it next pass, and a
  prefill into an empty batch, which becomes the running batch). Under the
  overlap scheduler that happens one step later, and each pass sees the
  outputs of the step before it one short (``LoopReq.inflight``).

In the pipeline (``schedtrace.replay.loop.micro_batches``) a pass decides for
one micro-batch's running batch, and the step processes the results of the
next micro-batch's last step instead of its own.

A pass that raised, or whose allocation cannot be met, admits nothing
(the real allocator would have failed it); decode still runs.

Hybrid traces evolve every pool (``schedtrace.replay.loop.pools``): the SWA
side and the mamba state slots are held per request beside the full KV,
each admission must fit every pool, and ``pool_totals`` (free + evictable +
held, per pool) never changes: the closed loop checks that on every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from schedtrace.replay.loop.admit import admission_plan, admit, hand_over, insert, requeue_match
from schedtrace.replay.loop.micro_batches import MicroBatch
from schedtrace.replay.loop.records import replace_pass, to_pass, with_outputs  # re-exported
from schedtrace.replay.loop.pools import (  # ceil_page: re-exported
    FULL_POOL, LoopPools, StepPools, ceil_page, hold, release, slide_swa,
)
from schedtrace.replay.loop.ratio import RatioRule
from schedtrace.replay.loop.retraction import BY_LENGTH, RetractionOrder
from schedtrace.replay.loop.tree_share import process_inserts, take_landings
from schedtrace.tracer.contract.order import in_order
from schedtrace.tracer.contract.report import Decision

__all__ = ["LoopReq", "LoopState", "StepResult", "apply_decision", "ceil_page", "replace_pass", "to_pass",
           "with_outputs"]


@dataclass(eq=False)  # identity: two requests are never "equal"
class LoopReq:
    rid: str
    input_len: int
    max_new_tokens: int
    target_output: int  # output length at which it finishes (recorded Finish)
    output_len: int = 0
    prefix_len: int = 0  # waiting: cached prefix; chunked: tokens prefilled
    # waiting: the part of the prefix match in the evictable count (the rest is shared with
    # running requests); None: all of it
    prefix_cached: int | None = None
    kv_tokens: int = 0  # tokens in KV (seq length held)
    kv_held: int = 0  # page-rounded tokens held
    kv_shared: int = 0  # page-rounded tokens of its prefix held by the running request it shares them with
    lender: str | None = None  # that request (schedtrace.replay.loop.admit)
    priority: int | None = None
    ignore_eos: bool = False
    swa_held: int = 0  # page-rounded tokens held on the SWA side (paged SWA pools)
    mamba_held: int = 0  # mamba state slots held (the state and its tracking buffers)
    mamba_fork: bool = False  # it locks the tree's fork of its state from its last checkpoint (a slot more)
    ends_by_abort: bool = False  # a client aborted it while it ran: it stops at its recorded output
    inflight: int = 0  # overlap scheduling: outputs of the last forward not yet processed (0 or 1)
    # Tokens of its sequence in the radix tree. Processing a chunk's or a prefill's result inserts
    # what it filled, page-floored (checkpoint_kv_cache; decode tokens are not inserted):
    # ``tree_landing`` until then, the same step, or the next under overlap.
    tree_len: int = 0
    tree_landing: int = 0
    prefix_ids: bytes = b""  # Arrival.prefix_ids: an id per Header.prefix_block tokens (b"": not recorded)

    def growth(self, tokens: int, page_size: int) -> int:
        """Tokens it must add to its own to hold a sequence of ``tokens``."""
        return ceil_page(tokens, page_size) - self.kv_shared - self.kv_held

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
    # Scheduler.forward_ct, counted on from the recording's (Pass.forward_ct; None: not recorded)
    forward_ct: int | None = None
    new_token_ratio: float = 0.0  # schedtrace.replay.loop.ratio: from the recorded pass, evolved
    # The pipeline's other micro-batches, the next to run first (schedtrace.replay.loop.micro_batches)
    parked: list[MicroBatch] = field(default_factory=list)

    def copy(self) -> LoopState:
        return replace(
            self,
            waiting=[replace(r) for r in self.waiting],
            running=[replace(r) for r in self.running],
            chunked=replace(self.chunked) if self.chunked is not None else None,
            parked=[mb.copy() for mb in self.parked],
        )

    def held(self) -> list[LoopReq]:
        """The requests holding KV: every micro-batch's running ones and the chunked one."""
        chunked = [self.chunked] if self.chunked is not None else []
        return [*self.running, *(r for mb in self.parked for r in mb.running), *chunked]

    def requests(self) -> list[LoopReq]:
        return [*self.waiting, *self.held()]

    def pool_totals(self) -> dict[str, int]:
        """Free + evictable + held of every pool: a step moves units, never makes or loses them."""
        reqs = self.requests()
        totals = {"full": self.free + self.evictable + sum(r.kv_held for r in reqs)}
        if self.swa_free is not None:
            totals["swa"] = self.swa_free + (self.swa_evictable or 0) + sum(r.swa_held for r in reqs)
        if self.mamba_free is not None:
            totals["mamba"] = self.mamba_free + (self.mamba_evictable or 0) + sum(r.mamba_held + r.mamba_fork for r in reqs)
        return totals

    def signature(self) -> tuple:
        """Everything a decision depends on; equal signatures give equal decisions."""

        def key(r: LoopReq) -> tuple:
            return (r.rid, r.input_len, r.output_len, r.inflight, r.prefix_len, r.prefix_cached, r.kv_held,
                    r.max_new_tokens)

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
            tuple((tuple(key(r) for r in mb.running), mb.batch_is_full) for mb in self.parked),
        )

    @property
    def is_idle(self) -> bool:
        """Nothing to admit: sglang's pass returns at once without touching state."""
        return not self.waiting and self.chunked is None

    @property
    def is_empty(self) -> bool:
        """Nothing to admit and nothing runs in any micro-batch: the server is idle."""
        return self.is_idle and not self.running and not any(mb.running for mb in self.parked)


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


# ------------------------------------------------------------- evolution


def apply_decision(
    state: LoopState,
    decision: Decision,
    *,
    page_size: int,
    radix_cache: bool,
    pools: LoopPools = FULL_POOL,
    mixed_chunk: bool = False,
    overlap: bool = False,
    retract_every: int = 0,
    ratio: RatioRule | None = None,
    prefix_block: int = 0,
    retraction: RetractionOrder = BY_LENGTH,
) -> tuple[LoopState, StepResult]:
    """The state at the next pass's entry after ``decision`` and one forward step.

    The forward step is the prefill batch when the pass built one, else the
    running batch's decode (``Scheduler.get_next_batch_to_run``): a prefill
    pass decodes nothing unless ``mixed_chunk`` mixes the decode into it.

    ``overlap`` (sglang's overlap scheduler, ``event_loop_overlap``): a
    step's results are processed in the next step, after that pass is
    decided. So a pass sees the outputs of the step before it one short
    (``inflight``), and a request that step finished still runs at its
    entry; it decodes no more (``update_running_batch`` skips requests
    finishing by length) and leaves at the end of the step.

    ``retract_every`` (sglang's ``SGLANG_TEST_RETRACT`` hook, its interval; 0: off): a decode
    step at a multiple of that many forwards retracts at least one request
    (``update_running_batch``), counted by ``state.forward_ct``.

    ``ratio``: how ``state.new_token_ratio`` evolves (None: it holds). ``retraction``: whom a
    retraction keeps (sglang's ``--retraction-policy``).

    ``prefix_block``: tokens per prefix id (``Header.prefix_block``; 0: the trace has none, and
    an insert is taken to hold no tokens the tree had already).
    """
    state = state.copy()
    if decision.queue_order is not None and decision.error is None:
        # calc_priority sorted sglang's queue in place: the next pass starts from that order.
        state.waiting = in_order(state.waiting, decision.queue_order)
    result = StepResult()
    step = StepPools.of(state, pools, page_size, radix_cache)
    # Under overlap the last step's results are processed after this step's retraction.
    landed_last_step = take_landings(state.requests()) if overlap else []
    if decision.released and decision.error is None:
        # Priority preemption released these before admission; _add_request_to_queue appends them.
        for rid in decision.released:
            victim = next(r for r in state.running if r.rid == rid)
            state.running.remove(victim)
            _requeue(victim, state, step, state.requests())
    prefilled: list[LoopReq] = []  # prefills completed this pass: they run from the next pass

    need, plans = admission_plan(state, decision, page_size, prefix_block)
    # The SWA side pages the same new pages; each new request takes its mamba slots.
    slots = len(plans) * pools.mamba_slots_per_req
    shortfall = step.kv.shortfall(need)
    if step.swa is not None:
        shortfall = max(shortfall, step.swa.shortfall(need))
    mamba_shortfall = step.mamba.shortfall(slots) if step.mamba is not None else 0
    prefill_batch = False  # the pass built a batch: this step's forward is its prefill
    chunk_left = False
    if decision.error is not None:
        result.failed = True
    elif decision.over_ask > 0 or shortfall or mamba_shortfall:
        result.failed = True
        result.kv_shortfall = max(decision.over_ask, shortfall)
        result.mamba_shortfall = mamba_shortfall
    else:
        state.batch_is_full = decision.batch_is_full
        prefill_batch = bool(plans) or (state.chunked is not None and bool(decision.chunk_size))
        _advance_chunk(state, decision, step, prefilled)
        admit(state, decision, plans, step, prefilled, result)
        # The batch holds a chunk it leaves unfinished: this running batch's next pass filters that
        # out of its last batch, and the batch shrinking clears the latch (get_next_batch_to_run).
        chunk_left = state.chunked is not None and (
            bool(decision.chunk_size) or decision.new_chunked_rid == state.chunked.rid)

    # Finished by the last step, processed only now (overlap; without it none are left here).
    finishing = [r for r in state.running if r.output_len >= r.target_output]
    active = [r for r in state.running if r not in finishing]
    # A client's abort is only seen then too, so unlike a length finish that request decodes once
    # more (the output is dropped) before it leaves.
    aborting = [r for r in finishing if r.ends_by_abort] if overlap else []
    decoding = active + aborting if mixed_chunk or not prefill_batch else []
    state.running = [r for r in state.running if r not in decoding]
    forward_ct = state.forward_ct
    hook = bool(retract_every) and forward_ct is not None and not prefill_batch and forward_ct % retract_every == 0
    # update_running_batch (a decode step of its own) moves the ratio; an idle scheduler resets it.
    shrank = _decode(state, decoding, step, result, retraction, force_retract=hook,
                     ratio=None if prefill_batch else ratio)
    for req in aborting:
        req.output_len = min(req.output_len, req.target_output)
    if ratio is not None and not (prefill_batch or decoding):
        state.new_token_ratio = ratio.init
    if forward_ct is not None and (prefill_batch or decoding):
        state.forward_ct = forward_ct + 1  # Scheduler.run_batch counts every forward
    # The next pass makes the prefill batch the running batch (get_next_batch_to_run merges
    # last_batch into an empty one by taking it), and that batch's latch is its own: never set.
    into_empty = bool(prefilled) and not state.running
    for req in prefilled:
        req.output_len += 1  # the prefill's forward samples the first token
        state.running.append(req)
    done = [r for r in finishing if r in state.running]  # (an aborting one may have been retracted)
    if not overlap and not state.parked:
        done += [r for r in decoding + prefilled if r in state.running and r.output_len >= r.target_output]
    shrank = _finish(done, state.running, state, step, result) or shrank
    processed = state.running  # whose results the step processes: its own, or the next micro-batch's
    if state.parked:
        turn = state.parked[0]
        processed = turn.running
        if _finish([r for r in turn.running if r.output_len >= r.target_output], turn.running, state, step, result):
            turn.batch_is_full = False
    if overlap:
        forwarded = set(map(id, decoding + prefilled))  # this step's batch: its outputs are in flight
        for req in state.running:
            req.inflight = 1 if id(req) in forwarded else 0
    if shrank or chunk_left or into_empty:
        state.batch_is_full = False  # sglang clears the latch whenever the batch shrinks, or is replaced
    if not overlap:
        landed_last_step = take_landings([*processed, *([state.chunked] if state.chunked is not None else [])])
    process_inserts(state, landed_last_step, step, prefix_block)
    step.store(state)
    return state, result


def _finish(done: list[LoopReq], batch: list[LoopReq], state: LoopState, step: StepPools,
            result: StepResult) -> bool:
    """Requests of ``batch`` that finished leave it: their KV cached (or freed), their slots free."""
    for req in done:
        batch.remove(req)
        hand_over(req, state.requests())
        release(req, step, cached=step.radix_cache)
        state.req_slots_free += 1
        result.finished.append(req.rid)
    return bool(done)


def abort_chunked(state: LoopState, *, page_size: int, radix_cache: bool, pools: LoopPools = FULL_POOL) -> LoopState:
    """A client aborted the chunked request: sglang ends it at the top of the next step
    (``Scheduler.process_pending_chunked_abort``, ``release_kv_cache``). The chunks whose results
    landed stay in the tree (evictable); the rest, the chunk in flight included, is freed."""
    state = state.copy()
    req = state.chunked
    assert req is not None
    step = StepPools.of(state, pools, page_size, radix_cache)
    hand_over(req, state.requests())
    release(req, step, cached=radix_cache, kv_cached=max(req.tree_len - req.kv_shared, 0))  # a lender holds the rest
    state.chunked = None
    state.req_slots_free += 1
    step.store(state)
    return state


def _advance_chunk(state: LoopState, decision: Decision, step: StepPools, prefilled: list[LoopReq]) -> None:
    chunked = state.chunked
    if chunked is None or not decision.chunk_size:
        return
    if not step.radix_cache:
        slide_swa(chunked, chunked.prefix_len, step, interval=0)  # extend eviction without prefix sharing
    chunked.prefix_len += decision.chunk_size
    hold(chunked, chunked.prefix_len, step)
    insert(chunked, step)
    if chunked.prefix_len >= chunked.fill_len:
        prefilled.append(chunked)
        state.chunked = None


def _decode(state: LoopState, decoding: list[LoopReq], step: StepPools, result: StepResult,
            retraction: RetractionOrder, force_retract: bool = False, ratio: RatioRule | None = None) -> bool:
    """One decode token for each of ``decoding``; retract until it fits (at least one with
    ``force_retract``, as ``retract_decode``'s first round), moving the ratio by ``ratio``; a
    retraction leaves the batch in ``retraction``'s ranking. True if any left."""
    if not decoding:
        return False
    page_size = step.page_size

    def growth(reqs: list[LoopReq]) -> int:
        return sum(r.growth(r.kv_tokens + 1, page_size) for r in reqs)

    def fits(tokens: int) -> bool:
        return step.kv.fits(tokens) and (step.swa is None or step.swa.fits(tokens))

    keep = retraction.ranked(decoding)  # retracted from its end; at least one always stays
    retracted: list[LoopReq] = []
    while len(keep) > 1 and (force_retract or not fits(growth(keep))):
        force_retract = False
        retracted.append(keep.pop())
    for req in retracted:
        _requeue(req, state, step, [*keep, *state.running, *state.requests()])
        result.retracted.append(req.rid)
    kept = keep if retracted else decoding  # filter_batch(keep_indices=sorted_indices)
    if ratio is not None:
        state.new_token_ratio = ratio.after_retract(kept) if retracted else ratio.decayed(state.new_token_ratio)
    for req in kept:
        if fits(req.growth(req.kv_tokens + 1, page_size)):
            hold(req, req.kv_tokens + 1, step)
            req.output_len += 1
        slide_swa(req, req.kv_tokens, step, step.pools.swa_eviction_interval)
        state.running.append(req)
    return bool(retracted)


def _requeue(req: LoopReq, state: LoopState, step: StepPools, others: list[LoopReq]) -> None:
    """A running request back to the queue's end with its outputs, its KV given back (retraction,
    preemption): it prefills its prompt and outputs again.

    ``release_kv_cache`` frees what the tree does not hold and unlocks the rest: what its prefills
    inserted stays cached (evictable), and the request matches it again when it is next queued."""
    hand_over(req, others)
    req.output_len -= req.inflight  # the result processor skips a retracted request's last output
    req.tree_landing = 0  # and does not insert its last prefill
    kept = requeue_match(req, step)
    kept_own = max(min(kept, req.kv_held + req.kv_shared) - req.kv_shared, 0)
    step.kv.give(kept_own, True)
    req.kv_held -= kept_own
    release(req, step, cached=False)
    req.kv_tokens = 0
    req.prefix_len = min(kept, req.fill_len - 1)
    req.prefix_cached = None if req.lender is None else min(kept_own, req.prefix_len)
    req.kv_shared = 0
    req.lender = None
    req.inflight = 0
    state.req_slots_free += 1
    state.waiting.append(req)
