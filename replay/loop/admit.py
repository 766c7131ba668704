"""How an admission takes KV in a closed loop: its cached prefix, a prefix it
shares with a running request, and the page-rounded extend.

Pure: no sglang, no I/O (``schedtrace.replay.loop.state`` calls it). A
waiting request's prefix match is in the radix cache; locking it takes
what of it is evictable (``prefix_cached``, from the recorded
``Candidate.locked_evictable``; all of it when not recorded). The rest of
the match is protected: other running requests hold it. It is lent from
the running request that holds those pages: where the trace has prefix ids,
one whose prompt agrees with the borrower's that far; else one whose prompt
is long enough to hold it (the one to run longest). When the lender leaves
first, a borrower keeps the pages (``hand_over``): a tree node stays while
any request locks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedtrace.replay.loop.pools import StepPools, ceil_page, floor_page, hold, swa_window_tokens
from schedtrace.replay.loop.tree_share import common_tokens
from schedtrace.tracer.contract.report import Decision

if TYPE_CHECKING:
    from collections.abc import Iterable

    from schedtrace.replay.loop.state import LoopReq, LoopState, StepResult


@dataclass(frozen=True)
class Admission:
    """One admitted request: its extend and who lends it the shared part of its match."""

    extend: int
    lender: str | None = None


def lockable(req: LoopReq, page_size: int) -> int:
    """The part of ``req``'s prefix match that locking takes from the evictable count."""
    prefix = ceil_page(req.prefix_len, page_size)
    return prefix if req.prefix_cached is None else min(prefix, req.prefix_cached)


def _lender(state: LoopState, shared: int, ids: bytes = b"", block: int = 0) -> str | None:
    """A running (or the chunked) request that can hold ``shared`` tokens of a prompt: where its
    ids are known (``block`` tokens an id), one whose ids agree with them to the last whole block
    (a request of another family shares no page of it, however long its prompt)."""
    holders = state.held()
    able = [r for r in holders if r.input_len >= shared and r.kv_held >= shared and r.output_len < r.target_output]
    if ids and block:
        whole = shared - shared % block
        able = [r for r in able if r.prefix_ids and common_tokens(ids, r.prefix_ids, block) >= whole] or able
    # The one to run longest: a wrong guess then shows last.
    return max(able, key=lambda r: r.target_output - r.output_len).rid if able else None


def admission_plan(state: LoopState, decision: Decision, page_size: int,
                   prefix_block: int = 0) -> tuple[int, dict[str, Admission]]:
    """Tokens the pass allocates, and each admitted request's admission (the continuing chunk aside;
    ``prefix_block``: tokens per prefix id, 0 without ids)."""
    by_rid = {r.rid: r for r in state.waiting}
    plans: dict[str, Admission] = {}
    need = 0
    chunked = state.chunked
    chunk_size = decision.chunk_size or 0
    if chunked is not None and chunk_size > 0:
        need += chunked.growth(chunked.prefix_len + chunk_size, page_size)
    cached = state.evictable  # what the admitted prefixes can pin
    for rid, extend in decision.admitted:
        if chunked is not None and rid == chunked.rid:
            continue  # the continuing chunk, sized above
        req = by_rid.get(rid)
        if req is None or extend <= 0:
            continue
        prefix = ceil_page(req.prefix_len, page_size)
        locked = lockable(req, page_size)
        lender = _lender(state, prefix - locked, req.prefix_ids, prefix_block) if prefix > locked else None
        pinned = min(locked, cached)
        cached -= pinned
        # What is neither pinned nor lent is allocated: a cached match evicted here, or a
        # protected one no running request can hold.
        held_elsewhere = prefix - locked if lender is not None else 0
        need += ceil_page(req.prefix_len + extend, page_size) - pinned - held_elsewhere
        plans[rid] = Admission(extend=extend, lender=lender)
    return max(need, 0), plans


def admit(
    state: LoopState,
    decision: Decision,
    plans: dict[str, Admission],
    step: StepPools,
    prefilled: list[LoopReq],
    result: StepResult,
) -> None:
    by_rid = {r.rid: r for r in state.waiting}
    page_size = step.page_size
    for rid, plan in plans.items():
        req = by_rid[rid]
        state.waiting.remove(req)
        state.req_slots_free -= 1
        result.admitted.append(rid)
        # The matched prefix is pinned: it leaves the evictable counts.
        cached = lockable(req, page_size)
        if plan.lender is not None:
            req.kv_shared = ceil_page(req.prefix_len, page_size) - cached
            req.lender = plan.lender
        req.kv_held = step.kv.pin(cached)
        if step.radix_cache:  # its match is in the tree already: a retraction leaves it there
            req.tree_len = max(req.tree_len, floor_page(req.prefix_len, page_size))
        window = step.pools.swa_window
        if step.swa is not None and window is not None:
            req.swa_held = step.swa.pin(swa_window_tokens(cached, window, page_size))
        if step.mamba is not None:
            req.mamba_held = step.pools.mamba_slots_per_req
            step.mamba.take(req.mamba_held)
        req.prefix_len += plan.extend
        hold(req, req.prefix_len, step)
        insert(req, step)
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


def hand_over(req: LoopReq, others: Iterable[LoopReq]) -> None:
    """Before ``req`` lets go of its KV: what it lends stays, held by the borrower that shares
    the most of it (the others now borrow from that one)."""
    borrowers = [q for q in others if q is not req and q.lender == req.rid and q.kv_shared > 0]
    if not borrowers:
        return
    heir = max(borrowers, key=lambda q: q.kv_shared)  # max: the first of the largest
    lent = min(heir.kv_shared, req.kv_held)
    req.kv_held -= lent
    heir.kv_held += lent
    heir.kv_shared -= lent
    heir.lender = None
    for q in borrowers:
        if q is not heir:
            q.lender = heir.rid


def insert(req: LoopReq, step: StepPools) -> None:
    """A chunk or a prefill ran: processing its result, ``checkpoint_kv_cache`` puts its filled
    pages in the tree (``LoopReq.tree_landing``)."""
    if step.radix_cache:
        req.tree_landing = floor_page(req.prefix_len, step.page_size)


def requeue_match(req: LoopReq, step: StepPools) -> int:
    """The prefix a retracted or preempted request matches when it is queued again: what its
    prefills inserted, which releasing it leaves in the tree. A hybrid tree's match also needs
    the SWA or mamba state there: a mamba tree has it where checkpoints fork the state (the fork of
    the last one, ``LoopPools.mamba_forks``); else the release gave it back, and the match is none."""
    if step.swa is not None or (step.mamba is not None and not req.mamba_fork):
        return 0
    return req.tree_len
