"""The loop's inserts as they reach the radix tree, and what an insert holds that the tree has
already: ``RadixCache._insert_cache`` frees the duplicate pages and the request locks the tree's
instead. Pure, on the loop's requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedtrace.replay.loop.pools import StepPools, floor_page, fork_mamba
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES

if TYPE_CHECKING:
    from schedtrace.replay.loop.arm_tree import MatchHistory
    from schedtrace.replay.loop.state import LoopReq, LoopState


def common_tokens(a: bytes, b: bytes, block: int) -> int:
    """Tokens two prompts are known to share: their leading equal prefix ids, in whole blocks."""
    low, high = 0, min(len(a), len(b)) // PREFIX_ID_BYTES  # equal ids: at least low, at most high
    while low < high:
        mid = (low + high + 1) // 2
        if a[: mid * PREFIX_ID_BYTES] == b[: mid * PREFIX_ID_BYTES]:
            low = mid
        else:
            high = mid - 1
    return low * block


def _sharer(req: LoopReq, in_tree: list[LoopReq], block: int) -> tuple[int, LoopReq | None]:
    """The request in the tree whose ids agree with ``req``'s longest, and the tokens it holds of them."""
    best, source = 0, None
    for other in in_tree:
        if other is not req and other.prefix_ids:
            shared = min(common_tokens(req.prefix_ids, other.prefix_ids, block), other.tree_len)
            if shared > best:
                best, source = shared, other
    return best, source


def _share(req: LoopReq, duplicate: int, source: LoopReq) -> None:
    """``req`` gives up ``duplicate`` tokens of its own and shares ``source``'s pages instead."""
    req.kv_held -= duplicate
    req.kv_shared += duplicate
    if req.lender is None:
        req.lender = source.lender or source.rid  # the one that holds the pages


def share_duplicates(req: LoopReq, tokens: int, in_tree: list[LoopReq], step: StepPools, block: int) -> None:
    """``RadixCache._insert_cache`` (a checkpoint): what ``req`` inserts that the tree holds already
    (a sibling of its prefix family landed first, in this batch or before) is freed, and ``req``
    locks the sibling's pages instead: it shares them as it would a match."""
    best, source = _sharer(req, in_tree, block)
    duplicate = min(floor_page(min(best, tokens), step.page_size) - req.tree_len, req.kv_held)
    if source is None or duplicate <= 0:
        return
    step.kv.give(duplicate, False)
    _share(req, duplicate, source)


def settle_start(state: LoopState, page_size: int, block: int, history: MatchHistory | None = None,
                 requeues: dict[str, list[int]] | None = None, keeps_own: bool = True,
                 prompts: dict[str, bytes] | None = None, in_tree_before: dict[str, int] | None = None) -> None:
    """A mid-trace start's requests as the tree holds them (full pool and mamba; ``block``: tokens
    per prefix id, 0 without ids). A running request whose prefill's result was processed has its
    prompt in the tree; one whose result is in flight (overlap) lands it after the first step; the
    chunked one holds what it prefilled. Where a prompt's ids agree with one the tree held before
    it, the server holds those pages once, as ``_insert_cache`` freed the duplicates: the loop's
    rows had counted them for each request. The ids name whole blocks; a recorded match of either
    prompt inside the block where they part (``history``) gives the tokens they share; so does one
    of any request whose ids agree that far (``prompts``: rid -> ids, every arrival's), since a
    family's prompts part where their shared prefix ends.

    A request requeued before the start (``requeues``: rid -> its outputs at each requeue) prefilled
    those outputs again with its prompt, and the tree holds that whole fill (``cache_unfinished_req``
    inserts fill ids): a running one its last requeue's; a waiting one the requeue's before that
    (none: its prompt), which it matches when its own inserts keep their state (``keeps_own``: a
    full pool, or a mamba tree whose checkpoints fork it), less what the recording's candidate rows
    after its requeue show evicted (``ArrivalFeed``).

    A prefill in flight at the start (overlap) already has in the tree what its admission found
    there (``in_tree_before``: rid -> the prefix its admitting pass recorded): a match it locks, or
    its own earlier chunks, whose duplicates the chunk's stash freed. Only the rest lands later."""
    requeues = requeues or {}
    in_tree_before = in_tree_before or {}
    for req in state.waiting:
        outputs = requeues.get(req.rid)
        if keeps_own and req.output_len > 0 and outputs:
            filled = floor_page(req.input_len + (outputs[-2] if len(outputs) > 1 else 0), page_size)
            req.prefix_len = max(req.prefix_len, min(filled, req.fill_len - 1))
    in_tree: list[LoopReq] = []
    for req in state.held():
        if req.tree_landing:
            continue  # a parked micro-batch's prefill: its result, and so its insert, is processed later
        if req is state.chunked:
            tokens = floor_page(req.prefix_len, page_size)
        elif req.output_len > req.inflight:
            tokens = floor_page(req.input_len + requeues.get(req.rid, (0,))[-1], page_size)
        else:
            req.tree_landing = floor_page(req.input_len, page_size)
            tokens = floor_page(in_tree_before.get(req.rid, 0), page_size)
            if not tokens:
                continue
        if block and req.prefix_ids:
            best, source = _sharer(req, in_tree, block)
            if source is not None and history is not None:
                # Any of the family's recorded matches inside that block tells how far it shares.
                kin = {r.rid: r.prefix_ids for r in state.requests()} if prompts is None else prompts
                family = [req.rid, source.rid, *(rid for rid, ids in kin.items()
                                                 if ids and common_tokens(ids, req.prefix_ids, block) >= best)]
                exact = next((x for x in (history.within(rid, best, best + block, step=0) for rid in family)
                              if x is not None), None)
                if exact is not None:
                    best = min(exact, source.tree_len)
            duplicate = min(floor_page(min(best, tokens), page_size), req.kv_held)
            if source is not None and duplicate > 0:
                _share(req, duplicate, source)
        req.tree_len = max(req.tree_len, tokens)
        in_tree.append(req)


def take_landings(reqs: list[LoopReq]) -> list[tuple[LoopReq, int]]:
    """The inserts of ``reqs`` waiting for their results to be processed, taken (in batch order)."""
    landed = [(r, r.tree_landing) for r in reqs if r.tree_landing]
    for req, _ in landed:
        req.tree_landing = 0
    return landed


def process_inserts(state: LoopState, landed: list[tuple[LoopReq, int]], step: StepPools,
                     prefix_block: int) -> None:
    """The processed results reach the tree (``landed``: this step's, the last step's under
    overlap, the next micro-batch's in the pipeline), in batch order; a request retracted or
    preempted meanwhile is skipped, as the result processor skips it."""
    held = state.held()
    chunked = state.chunked
    if chunked is not None and chunked.tree_landing:
        # A chunk lands after the step's results: the next pass stashes it (stash_chunked_request,
        # a tree checkpoint) before it decides, overlap or not.
        landed = [*(item for item in landed if item[0] is not chunked), (chunked, chunked.tree_landing)]
        chunked.tree_landing = 0
    live = set(map(id, held))
    in_tree = [r for r in held if r.tree_len > 0]
    for req, tokens in landed:
        if id(req) not in live:
            continue
        if prefix_block and tokens > req.tree_len and step.swa is None:
            share_duplicates(req, tokens, in_tree, step, prefix_block)
        if tokens > req.tree_len:
            fork_mamba(req, step)
        req.tree_len = max(req.tree_len, tokens)
        in_tree.append(req)
