"""What an insert holds that the radix tree has already: ``RadixCache._insert_cache`` frees the
duplicate pages and the request locks the tree's instead. Pure, on the loop's requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schedtrace.replay.loop.pools import StepPools, floor_page
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES

if TYPE_CHECKING:
    from schedtrace.replay.loop.state import LoopReq


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


def share_duplicates(req: LoopReq, tokens: int, in_tree: list[LoopReq], step: StepPools, block: int) -> None:
    """``RadixCache._insert_cache`` (a checkpoint): what ``req`` inserts that the tree holds already
    (a sibling of its prefix family landed first, in this batch or before) is freed, and ``req``
    locks the sibling's pages instead: it shares them as it would a match."""
    best, source = 0, None
    for other in in_tree:
        if other is not req and other.prefix_ids:
            shared = min(common_tokens(req.prefix_ids, other.prefix_ids, block), other.tree_len)
            if shared > best:
                best, source = shared, other
    duplicate = floor_page(min(best, tokens), step.page_size) - req.tree_len
    duplicate = min(duplicate, req.kv_held)
    if source is None or duplicate <= 0:
        return
    step.kv.give(duplicate, False)
    req.kv_held -= duplicate
    req.kv_shared += duplicate
    if req.lender is None:
        req.lender = source.lender or source.rid  # the one that holds the pages
