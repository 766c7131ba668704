"""Turning recording on and off without a restart: ``SCHEDTRACE_CONTROL_FILE``.

The file holds one word, ``on`` or ``off`` (any case, surrounding space
ignored). The writer thread reads it at most every ``POLL_S`` and hands the
state to the recorder each time, so a state the recorder missed is applied
again at the next read. A missing file, an unreadable one or another word
changes nothing (the word is logged once). The scheduler thread only reads
one attribute of the recorder per pass (``Recorder.paused``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

POLL_S: Final = 1.0
MAX_READ: Final = 64  # bytes read: the word and some space


class ControlFile:
    def __init__(self, path: str, apply: Callable[[bool], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._apply = apply
        self._clock = clock
        self._last_poll: float | None = None
        self._bad_words: set[str] = set()

    def read(self) -> bool | None:
        """True for on, False for off, None for no word to act on."""
        try:
            with open(self.path, "rb") as file:
                word = file.read(MAX_READ).decode("utf-8", "replace").strip().lower()
        except OSError:
            return None
        if word in ("on", "off"):
            return word == "on"
        if word and word not in self._bad_words:
            self._bad_words.add(word)
            logger.warning("schedtrace: %s holds %r; expected 'on' or 'off' (ignored)", self.path, word[:20])
        return None

    def poll(self, *, force: bool = False) -> None:
        """Read the file if ``POLL_S`` has passed (or ``force``), and apply what it says."""
        now = self._clock()
        if not force and self._last_poll is not None and now - self._last_poll < POLL_S:
            return
        self._last_poll = now
        state = self.read()
        if state is not None:
            self._apply(state)
