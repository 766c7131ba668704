"""The disk budget of one writer (``SCHEDTRACE_MAX_TOTAL_BYTES``): the oldest parts go first.

The budget covers this writer's own parts (one scheduler process; a server
with N ranks in one directory uses up to N budgets). It is checked after
every write: while the closed parts and the current one together exceed it,
the oldest closed part is deleted. A part is cut at a quarter of the budget
(or ``SCHEDTRACE_MAX_BYTES`` if smaller), so deleting one frees a quarter at
most; a single write larger than the headroom overshoots until its part is
the oldest closed one. Deletions are counted (``deleted_parts``,
``deleted_bytes`` in every later footer) and logged once.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

PARTS_PER_BUDGET: Final = 4  # a part is at most this fraction of the budget


class DiskBudget:
    def __init__(self, max_total_bytes: int) -> None:
        self.max_total_bytes = max_total_bytes
        self._closed: deque[tuple[Path, int]] = deque()  # oldest first
        self._closed_bytes = 0
        self.deleted_parts = 0
        self.deleted_bytes = 0
        self.delete_errors = 0

    def part_limit(self, max_bytes: int) -> int:
        return max(1, min(max_bytes, self.max_total_bytes // PARTS_PER_BUDGET))

    def closed(self, path: Path, size: int) -> None:
        self._closed.append((path, size))
        self._closed_bytes += size

    def enforce(self, current_bytes: int) -> None:
        """Delete the oldest closed parts until they and the current part fit."""
        while self._closed and self._closed_bytes + current_bytes > self.max_total_bytes:
            path, size = self._closed.popleft()
            self._closed_bytes -= size
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass  # someone removed it already: the space is free either way
            except OSError as exc:
                self.delete_errors += 1
                if self.delete_errors == 1:
                    logger.warning("schedtrace: cannot delete %s to stay under the disk budget: %s "
                                   "(logged once, counted as delete_errors)", path, exc)
                continue
            self.deleted_parts += 1
            self.deleted_bytes += size
            if self.deleted_parts == 1:
                logger.warning("schedtrace: disk budget of %d bytes reached; deleting the oldest trace parts "
                               "(first %s; counted in the footers as deleted_parts)", self.max_total_bytes, path.name)

    def counts(self) -> dict[str, int]:
        counts = {"deleted_parts": self.deleted_parts, "deleted_bytes": self.deleted_bytes,
                  "delete_errors": self.delete_errors}
        return {name: n for name, n in counts.items() if n}
