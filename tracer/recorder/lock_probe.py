"""What pinning a candidate's prefix takes from the evictable count.

``PrefillAdder.add_one_req`` pins the candidate's matched prefix with
``tree_cache.lock(req.last_node)`` before sizing it against the budget, and
the pin takes out of the evictable count only the part no one had locked yet
(running requests sharing the prefix may hold the rest). A trace cannot say
which part that was from lengths alone, so the recorder keeps it: this is
``Candidate.locked_evictable``.

``lock`` takes the pin with ``inc_lock_ref``, whose ``IncLockRefResult.delta``
is that amount: the tokens the walk to the root moved out of the evictable
count. sglang's two trees give it opposite signs (``RadixCache`` the count's
change, the unified tree the tokens moved to protected), and a lock never
adds to the count, so the drop is its magnitude. Reading it costs an
attribute; reading the count around the lock cost two calls through the tree.

On an SWA tree the pin also takes the prefix's trailing window out of the
SWA evictable count, less what other holders already pin there; the result
does not say how much, so that count is read around the pin
(``Candidate.locked_swa_evictable``, which the SWA budget's mirror needs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Every ``inc_lock_ref`` sglang 0.5.23 defines; all other prefix caches inherit one of them.
LOCK_TARGETS = (
    "sglang.srt.mem_cache.radix_cache.RadixCache.inc_lock_ref",
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.inc_lock_ref",
)


class LockProbe:
    """The evictable drop of the first tree-cache pin taken while ``armed``.

    ``hook`` is an AROUND hook for the ``LOCK_TARGETS``, installed once like
    every recorder hook: it wraps the class methods, so no tree-cache object
    is ever changed (an instance attribute shadowing a method would also cost
    sglang its specialised attribute reads on that object). Unarmed, it only
    calls through. The candidate hook arms it (``drop`` None: no pin yet) and
    disarms it after ``add_one_req``; the first pin in between sets ``drop``
    (and ``swa_drop``, with an SWA reader) and disarms it, so the commit's
    second pin on the same prefix goes straight through. A result without a
    readable delta, or a failed read, leaves None and sets ``error``; it never
    reaches the pin's caller. ``swa_evictable`` is the attached scheduler's
    SWA reader (``PoolReaders.swa_evictable``), None without an SWA pool.
    """

    __slots__ = ("armed", "drop", "swa_drop", "error", "swa_evictable")

    def __init__(self) -> None:
        self.armed = False
        self.drop: int | None = None
        self.swa_drop: int | None = None
        self.error: Exception | None = None
        self.swa_evictable: Callable[[], int] | None = None  # set at the recorder's first pool read

    def hook(self, original: Any, tree_cache: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.armed:
            return original(tree_cache, *args, **kwargs)
        self.armed = False
        swa_evictable = self.swa_evictable
        if swa_evictable is None:
            result = original(tree_cache, *args, **kwargs)
        else:
            try:
                swa_before = swa_evictable()
            except Exception as exc:
                self.error, swa_evictable = exc, None
            result = original(tree_cache, *args, **kwargs)
        try:
            self.drop = abs(result.delta or 0)  # None: a disabled tree, which pins nothing
            if swa_evictable is not None:
                self.swa_drop = swa_before - swa_evictable()
        except Exception as exc:
            self.error = exc
        return result
