"""Moved to ``schedtrace.arms.fixes`` (the arms' own room); kept for callers of the old name."""

from schedtrace.arms.fixes import AITER, CHUNK_CAP, FIX_NAMES, FIXES, LATCH, ONE_CHUNK  # noqa: F401
