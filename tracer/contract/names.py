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
# Recorder integrity and rank identity (tracer/recorder; README, "Recording on a GPU server").
RUN_ID_ENV: Final = "SCHEDTRACE_RUN_ID"  # set by the launcher's plugin load; every rank inherits it
# The prefix ids' secret (hex), set beside the run id and inherited the same way; never written.
PREFIX_KEY_ENV: Final = "SCHEDTRACE_PREFIX_KEY"
FSYNC_MS_ENV: Final = "SCHEDTRACE_FSYNC_MS"  # fsync period; 0: only at rotation and close
CLOCK_S_ENV: Final = "SCHEDTRACE_CLOCK_S"  # Clock record period
MAX_TOTAL_BYTES_ENV: Final = "SCHEDTRACE_MAX_TOTAL_BYTES"  # disk budget per scheduler process; 0: none
MODE_ENV: Final = "SCHEDTRACE_MODE"  # "file" (default) or "ring"
RING_BYTES_ENV: Final = "SCHEDTRACE_RING_BYTES"  # ring mode: encoded bytes kept in memory
CONTROL_FILE_ENV: Final = "SCHEDTRACE_CONTROL_FILE"  # a file holding "on" or "off"
# `--ray` with no --address: Ray's own variable names the cluster (replay.scale.ray_executor; README).
RAY_ADDRESS_ENV: Final = "RAY_ADDRESS"
RAY_MAX_RETRIES: Final = 3  # times Ray runs a task again after its worker died

# Loss.reason: why the writer has no records for a stretch ("queue_full" is the schema's default).
LOSS_QUEUE_FULL: Final = "queue_full"  # the writer queue was full: the newest records were dropped
LOSS_WRITE_ERROR: Final = "write_error"  # a write failed (disk full, I/O error)
LOSS_RING: Final = "ring"  # ring mode: records fell off the ring before a trigger wrote it out
LOSS_PAUSED: Final = "paused"  # recording was off (the control file): passes and events not recorded
LOSS_PASS_TOO_LARGE: Final = "pass_too_large"  # a pass past SEEK_BYTES whole: it and its events not written

# Writer defaults (the environment can override each; the fsync period is the contract writer's DEFAULT_FSYNC_EVERY_S).
DEFAULT_MAX_BYTES: Final = 256 << 20
DEFAULT_QUEUE_SIZE: Final = 65536
DEFAULT_CLOCK_S: Final = 10
DEFAULT_RING_BYTES: Final = 64 << 20
FILE_MODE: Final = "file"
RING_MODE: Final = "ring"

# The two named arms; a fix name or a comma list of them is an arm too.
STOCK: Final = "stock"
FIXED: Final = "fixed"
# A user arm is a file: a unified diff of sglang's python/ tree, or a module of source edits
# (schedtrace.arms.user). Reports name it FILE@HASH: its file name and the first
# ARM_DIGEST_CHARS hex digits of its content's sha256.
ARM_DIGEST_CHARS: Final = 12
STANDINS_ENV: Final = "SCHEDTRACE_SANDBOX_STANDINS"  # set by SandboxServer for its own processes only
START_METHOD_ENV: Final = "SCHEDTRACE_SANDBOX_START_METHOD"  # "fork" (default) or "spawn", sglang's own
# sglang's platform switch, read once when sglang is first imported: set it before that.
SGLANG_CPU_ENGINE_ENV: Final = "SGLANG_USE_CPU_ENGINE"
ARM_FILES_ENV: Final = "SCHEDTRACE_ARM_FILES"  # the arm files a process loaded, for the processes it starts
BUILTIN_DIFF: Final = "builtin-fixes.diff"  # the four fixes as one diff, shipped in schedtrace.arms

# A stall: at least this many consecutive recorded passes that admit nothing
# although a slot is free and the head fits (tracer.analysis.stalls).
DEFAULT_STALL_PASSES: Final = 8

# sglang's /health probes generate one token under this rid prefix (sglang.srt.constants); a
# re-drive or a workload export leaves them out: they are the server's own, not the clients'.
SGLANG_HEALTH_CHECK_RID_PREFIX: Final = "HEALTH_CHECK"

# Finish.reason of a request refused at --max-queued-requests: it arrived and never queued.
FINISH_REJECTED: Final = "rejected"

MAMBA_NO_BUFFER: Final = "no_buffer"  # --mamba-radix-cache-strategy whose checkpoints fork the state

# Error text kept in a record: "Type: message", cut to this many characters.
ERROR_TEXT_LIMIT: Final = 500

# sglang's own variables that its admission arithmetic reads (the stall rule mirrors it), with its defaults.
SGLANG_CLIP_MAX_NEW_TOKENS_ENV: Final = "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"
SGLANG_CLIP_MAX_NEW_TOKENS_DEFAULT: Final = 4096
# The SWA side's eviction stride (envs.SGLANG_SWA_EVICTION_INTERVAL), which the closed loop evolves by.
SGLANG_SWA_EVICTION_INTERVAL_ENV: Final = "SGLANG_SWA_EVICTION_INTERVAL"
SGLANG_SWA_EVICTION_INTERVAL_DEFAULT: Final = 128
# sglang's retraction test hook (envs.SGLANG_TEST_RETRACT): a retraction every INTERVAL forwards.
SGLANG_TEST_RETRACT: Final = "SGLANG_TEST_RETRACT"
SGLANG_TEST_RETRACT_INTERVAL: Final = "SGLANG_TEST_RETRACT_INTERVAL"
# sglang's switch that makes every prefix match a miss (envs.SGLANG_RADIX_FORCE_MISS), read per match.
SGLANG_RADIX_FORCE_MISS: Final = "SGLANG_RADIX_FORCE_MISS"

# Reading limits (tracer/contract; docs/trace-format.md, "Safety limits" and "Reading untrusted files").
# What one record may be: the reader's default max_record_bytes (a larger one is refused, not read).
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
# The writer seals a batch once it holds this many bytes (a large write_many
# becomes several batches in one write): it bounds what one bad byte costs.
SPLIT_BYTES: Final = 256 * 1024
# No honest batch is larger: SPLIT_BYTES of records plus one record of up to the record limit.
MAX_BATCH_BYTES: Final = MAX_RECORD_BYTES + SPLIT_BYTES
# How far past the header a reader looks for a batch when the first marker is missing.
FIRST_BATCH_WINDOW: Final = 2 * SPLIT_BYTES
# No msgpack object is shorter: what a count of records (a marker's, a gap's) can claim of its bytes.
MIN_RECORD_BYTES: Final = 1
# No pass record (whole or delta) is shorter: a gap held at most size / this passes, whatever it claims.
MIN_PASS_BYTES: Final = 24
# No request row encodes shorter (a running row ["", 0, 0, 0]): the rows a list of a record could hold.
MIN_ROW_BYTES: Final = 5
# v2: a pass is at most this many - 1 deltas after its keyframe (the writer's interval, at most; the reader's bound).
MAX_KEYFRAME_INTERVAL: Final = 1024
# v2: rows the reader builds rebuilding the deltas after a keyframe, at most this many per byte of the file from the
# keyframe to the delta (a stepped running row is built anew; a copied row costs 1 / COPIES_PER_BUILT_ROW of one).
BUILT_ROWS_PER_BYTE: Final = 2
COPIES_PER_BUILT_ROW: Final = 64  # a copied row is a reference (some 3 ns), a built one an object (some 220 ns)
# What one seek may decode: the pass records from a keyframe through any pass after it hold at most this many
# bytes, and no pass record is larger (v1 too). A pass of more (some 17,000 queued requests of real rows) is
# written as a Loss; a record past it is damaged. It bounds a cold pass_at on any file (docs/trace-format.md).
SEEK_BYTES: Final = 768 << 10
# Bytes hashed for batches that fail, in units of the data's size (plus two batches): the search after damage.
HASH_BUDGET: Final = 2
LOCATE_BYTES: Final = 1 << 20  # how far into a failed batch the reader looks for the bad record
UNKNOWN_TAGS: Final = 64  # distinct unknown tags counted by name; the rest as "(other tags)" (the file names them)
RELEASE_AFTER_CHECK_BYTES: Final = 64 << 20  # a check of a file this big drops the pages it touched

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
