"""Every name and default that more than one module uses, in one place.

Environment variables are read only through ``env_flag`` and ``env_int``,
so each is parsed one way everywhere.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Final

logger = logging.getLogger(__name__)

# The sglang release the fixes, the replayer and the hook points are written against.
PINNED_SGLANG: Final = "0.5.23"

# Environment variables the sglang plugin reads (README, "Recording on a GPU server").
DIR_ENV: Final = "SCHEDTRACE_DIR"
FIXES_ENV: Final = "SCHEDTRACE_FIXES"
MAX_BYTES_ENV: Final = "SCHEDTRACE_MAX_BYTES"
QUEUE_ENV: Final = "SCHEDTRACE_QUEUE"
OTEL_ENV: Final = "SCHEDTRACE_OTEL"

# Writer defaults (the environment can override both).
DEFAULT_MAX_BYTES: Final = 256 << 20
DEFAULT_QUEUE_SIZE: Final = 65536

# The two named arms; a fix name or a comma list of them is an arm too.
STOCK: Final = "stock"
FIXED: Final = "fixed"

# A stall: at least this many consecutive recorded passes that admit nothing
# although a slot is free and the head fits (tracer.analysis.stalls).
DEFAULT_STALL_PASSES: Final = 8

# Error text kept in a record: "Type: message", cut to this many characters.
ERROR_TEXT_LIMIT: Final = 500

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})


def error_text(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``, bounded, as records and reports keep it."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_LIMIT]


def split_error(error: str) -> tuple[str, str]:
    """``"Type: message"`` -> (type, message)."""
    kind, sep, message = error.partition(": ")
    return (kind, message) if sep else ("Exception", error)


def env_flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off (any case); unset is off."""
    raw = environ.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw not in _FALSE:
        logger.warning("schedtrace: %s=%r is not a boolean (1/0, true/false); taken as off", name, raw)
    return False


def env_int(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
    """An integer variable; unset or malformed gives ``default`` (malformed is logged)."""
    raw = environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        logger.warning("schedtrace: %s=%r is not an integer; using %d", name, raw, default)
        return default
