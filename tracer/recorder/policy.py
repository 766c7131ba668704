"""How a writer treats the disk: fsync period, Clock period, disk budget, ring mode.

``WriterPolicy.from_env`` reads the plugin's environment (names.py); the
defaults are what a writer built in code gets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from schedtrace.tracer.contract.format import DEFAULT_FSYNC_EVERY_S, FileOps
from schedtrace.tracer.contract.names import (
    CLOCK_S_ENV,
    CONTROL_FILE_ENV,
    DEFAULT_CLOCK_S,
    DEFAULT_RING_BYTES,
    FILE_MODE,
    FSYNC_MS_ENV,
    MAX_TOTAL_BYTES_ENV,
    MODE_ENV,
    RING_BYTES_ENV,
    RING_MODE,
    env_int,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterPolicy:
    # fsync a part this often (and always at rotation and close); None: only then.
    fsync_every_s: float | None = DEFAULT_FSYNC_EVERY_S
    clock_every_s: float = DEFAULT_CLOCK_S  # a Clock record at least this often (and at each part's start)
    max_total_bytes: int = 0  # keep this writer's parts under it, deleting the oldest; 0: no budget
    ring_bytes: int = 0  # > 0: ring mode, keeping this many encoded bytes in memory until a trigger
    control_file: str | None = None  # "on"/"off" in it turns recording on and off
    file_ops: FileOps | None = None  # the system calls; a test passes one that fails like a full disk

    @property
    def ring(self) -> bool:
        return self.ring_bytes > 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WriterPolicy:
        fsync_ms = env_int(FSYNC_MS_ENV, int(DEFAULT_FSYNC_EVERY_S * 1000), environ)
        mode = environ.get(MODE_ENV, "").strip().lower() or FILE_MODE
        if mode not in (FILE_MODE, RING_MODE):
            logger.warning("schedtrace: %s=%r is neither %r nor %r; writing files", MODE_ENV, mode, FILE_MODE, RING_MODE)
            mode = FILE_MODE
        ring_bytes = max(1, env_int(RING_BYTES_ENV, DEFAULT_RING_BYTES, environ)) if mode == RING_MODE else 0
        return cls(
            fsync_every_s=fsync_ms / 1000 if fsync_ms > 0 else None,
            clock_every_s=max(1, env_int(CLOCK_S_ENV, DEFAULT_CLOCK_S, environ)),
            max_total_bytes=max(0, env_int(MAX_TOTAL_BYTES_ENV, 0, environ)),
            ring_bytes=ring_bytes,
            control_file=environ.get(CONTROL_FILE_ENV) or None,
        )
