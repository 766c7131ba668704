"""Measure what pinning a candidate's prefix takes from the evictable count.

``PrefillAdder.add_one_req`` pins the candidate's matched prefix with
``tree_cache.lock(req.last_node)`` before sizing it against the budget, and
the pin takes out of the evictable count only the part no one had locked yet
(running requests sharing the prefix may hold the rest). A trace cannot say
which part that was from lengths alone, so the recorder measures it: this is
``Candidate.locked_evictable``.
"""

from __future__ import annotations

from typing import Any

from tracer.snapshot import cache_evictable


class LockProbe:
    """How far the evictable count drops when the adder first locks a candidate's prefix.

    The probe shadows ``lock`` on the tree-cache *instance* for one ``add_one_req``
    call (``install``/``remove``), so every other lock in the server runs
    unwrapped, and reads the evictable count around the first call. ``drop``
    stays None if no lock was taken; a failed read leaves it None, sets
    ``error`` and never reaches the lock's caller.
    """

    __slots__ = ("tree_cache", "drop", "error", "_lock", "_done", "_shadowed")

    def __init__(self, tree_cache: Any) -> None:
        self.tree_cache = tree_cache
        self.drop: int | None = None
        self.error: Exception | None = None
        self._done = False

    def install(self) -> None:
        tree_cache = self.tree_cache
        self._shadowed = tree_cache.__dict__.get("lock")  # an instance attribute we must put back
        self._lock = tree_cache.lock
        tree_cache.lock = self.lock

    def remove(self) -> None:
        if self._shadowed is not None:
            self.tree_cache.lock = self._shadowed
        else:
            del self.tree_cache.lock

    def lock(self, *args: Any, **kwargs: Any) -> Any:
        if self._done:
            return self._lock(*args, **kwargs)
        self._done = True
        try:
            before = cache_evictable(self.tree_cache)
        except Exception as exc:
            self.error = exc
            return self._lock(*args, **kwargs)
        result = self._lock(*args, **kwargs)
        try:
            self.drop = before - cache_evictable(self.tree_cache)
        except Exception as exc:
            self.error = exc
        return result
