"""Decoded passes by number, for the handful of rows on screen."""

from __future__ import annotations

from collections import OrderedDict

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Pass


class PassCache:
    """Decoded passes by number, at most ``size`` kept (the visible rows and a few more)."""

    def __init__(self, reader: TraceReader, size: int = 512) -> None:
        self.reader = reader
        self.size = size
        self._cache: OrderedDict[int, Pass] = OrderedDict()

    def get(self, n: int) -> Pass:
        cache = self._cache
        hit = cache.get(n)
        if hit is not None:
            cache.move_to_end(n)
            return hit
        p = self.reader.pass_at(n)
        cache[n] = p
        if len(cache) > self.size:
            cache.popitem(last=False)
        return p

    def __len__(self) -> int:
        return len(self._cache)
