"""What an insert holds that the radix tree has already: ``RadixCache._insert_cache`` frees the
duplicate pages and the request locks the tree's instead. Pure, on the loop's requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedtrace.replay.loop.pools import StepPools, floor_page
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


def settle_start(state: LoopState, page_size: int, block: int, history: MatchHistory | None = None) -> None:
    """A mid-trace start's requests as the tree holds them (full pool and mamba; ``block``: tokens
    per prefix id, 0 without ids). A running request whose prefill's result was processed has its
    prompt in the tree; one whose result is in flight (overlap) lands it after the first step; the
    chunked one holds what it prefilled. Where a prompt's ids agree with one the tree held before
    it, the server holds those pages once, as ``_insert_cache`` freed the duplicates: the loop's
    rows had counted them for each request. The ids name whole blocks; a recorded match of either
    prompt inside the block where they part (``history``) gives the tokens they share."""
    in_tree: list[LoopReq] = []
    for req in state.held():
        if req is state.chunked:
            tokens = floor_page(req.prefix_len, page_size)
        elif req.output_len > req.inflight:
            tokens = floor_page(req.input_len, page_size)
        else:
            req.tree_landing = floor_page(req.input_len, page_size)
            continue
        if block and req.prefix_ids:
            best, source = _sharer(req, in_tree, block)
            if source is not None and history is not None:
                # Any of the family's recorded matches inside that block tells how far it shares.
                family = [req, source, *(r for r in state.requests() if r.prefix_ids
                                         and common_tokens(r.prefix_ids, req.prefix_ids, block) >= best)]
                exact = next((x for x in (history.within(r.rid, best, best + block, step=0) for r in family)
                              if x is not None), None)
                if exact is not None:
                    best = min(exact, source.tree_len)
            duplicate = min(floor_page(min(best, tokens), page_size), req.kv_held)
            if source is not None and duplicate > 0:
                _share(req, duplicate, source)
        req.tree_len = max(req.tree_len, tokens)
        in_tree.append(req)
