"""Moved to ``schedtrace.arms.patching`` (the arms' own room); kept for callers of the old name."""

from schedtrace.arms.patching import (  # noqa: F401
    EditStatus, Fix, PreparedEdit, PreparedFix, SourceEdit, prepare, resolve, same_code, sglang_version,
)
