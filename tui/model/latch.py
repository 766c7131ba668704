"""Since which pass the ``batch_is_full`` latch has held, for every pass, in compact runs.

``why`` names the pass whose outcome latched the flag ("latched since 866");
``why_trace`` finds it by walking every pass in order, decoding each one. The
browser decodes only the passes on screen, so the scan feeds each pass's two
flags here once, with ``why_trace``'s rule (``why.latch_since``), and any
pass can then be asked.
tests/test_tui.py holds this to ``why_trace`` on a recorded sample.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

from schedtrace.tracer.analysis.why import latch_since


class LatchRuns:
    """Runs of consecutive passes latched since one pass: (since seq, first pass, last pass)."""

    def __init__(self) -> None:
        self.since = array("q")  # the seq whose outcome latched the flag
        self.first = array("q")  # pass numbers (indices) the run covers
        self.last = array("q")
        self._since: int | None = None

    def feed(self, n: int, seq: int, batch_is_full_in: bool, batch_is_full_out: bool) -> None:
        """Pass number ``n`` (its record's ``seq``) with its two flags, in order."""
        since = self._since
        if batch_is_full_in and since is not None:
            if self.since and self.since[-1] == since and self.last[-1] == n - 1:
                self.last[-1] = n
            else:
                self.since.append(since)
                self.first.append(n)
                self.last.append(n)
        self._since = latch_since(since, seq, batch_is_full_in, batch_is_full_out)  # why_trace's rule

    def since_at(self, n: int) -> int | None:
        """The pass seq the latch has held since at pass ``n`` (None: not latched in)."""
        i = bisect_right(self.first, n) - 1
        if i >= 0 and n <= self.last[i]:
            return self.since[i]
        return None
