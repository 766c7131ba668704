"""Measure what pinning a candidate's prefix takes from the evictable count.

``PrefillAdder.add_one_req`` pins the candidate's matched prefix with
``tree_cache.lock(req.last_node)`` before sizing it against the budget, and
the pin takes out of the evictable count only the part no one had locked yet
(running requests sharing the prefix may hold the rest). A trace cannot say
which part that was from lengths alone, so the recorder measures it: this is
``Candidate.locked_evictable``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Every ``lock`` sglang 0.5.23 defines; all other prefix caches inherit one of them.
LOCK_TARGETS = (
    "sglang.srt.mem_cache.base_prefix_cache.BasePrefixCache.lock",
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.lock",
)


class LockProbe:
    """How far the evictable count drops at the first tree-cache lock after ``arm``.

    ``hook`` is an AROUND hook for the ``LOCK_TARGETS``, installed once like
    every recorder hook: it wraps the class methods, so no tree-cache object
    is ever changed (an instance attribute shadowing ``lock`` would also cost
    sglang its specialised attribute reads on that object). Outside
    ``arm``/``disarm`` it only calls through. Inside, the first lock is
    measured by reading the evictable count around it (nested calls, such as a
    subclass's ``lock`` calling its base, then go straight through).
    ``disarm`` returns the drop, None if no lock was taken; a failed read
    leaves None, sets ``error`` and never reaches the lock's caller.
    ``evictable`` is the attached scheduler's reader (``PoolReaders.evictable``).
    """

    __slots__ = ("armed", "drop", "error", "evictable")

    def __init__(self) -> None:
        self.armed = False
        self.drop: int | None = None
        self.error: Exception | None = None
        self.evictable: Callable[[], int] | None = None  # set when the recorder attaches

    def arm(self) -> None:
        self.drop = None
        self.armed = True

    def disarm(self) -> int | None:
        self.armed = False
        return self.drop

    def hook(self, original: Any, tree_cache: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.armed:
            return original(tree_cache, *args, **kwargs)
        self.armed = False
        try:
            evictable = self.evictable
            before = evictable()
        except Exception as exc:
            self.error = exc
            return original(tree_cache, *args, **kwargs)
        result = original(tree_cache, *args, **kwargs)
        try:
            self.drop = before - evictable()
        except Exception as exc:
            self.error = exc
        return result
