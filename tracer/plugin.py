"""sglang general plugin entry point (``sglang.srt.plugins`` -> ``register``).

sglang calls ``register()`` in every process it starts (tokenizer manager,
scheduler, detokenizer) and then ``HookRegistry.apply_hooks()``.

Environment:

* ``SCHEDTRACE_FIXES`` -- install the named scheduler fixes
  (``schedtrace.replay.variants.install_fixes_from_env``) before anything else;
* ``SCHEDTRACE_DIR`` -- record: without it no recorder hook is installed;
* ``SCHEDTRACE_MAX_BYTES`` -- rotate to a new part past this size (256 MiB);
* ``SCHEDTRACE_QUEUE`` -- writer queue length; a full queue drops (65536);
* ``SCHEDTRACE_OTEL=1`` -- mirror records as spans (``schedtrace.tracer.export.otel_mirror``).

Hook targets are resolved here first, so a hook point missing from the
installed sglang costs one warning and is left out instead of an exception
from ``HookRegistry``.
"""

from __future__ import annotations

import logging
import os
import pkgutil

from schedtrace.tracer.recorder.writer_thread import DEFAULT_MAX_BYTES, DEFAULT_QUEUE_SIZE, Sink

logger = logging.getLogger(__name__)

DIR_ENV = "SCHEDTRACE_DIR"
FIXES_ENV = "SCHEDTRACE_FIXES"
MAX_BYTES_ENV = "SCHEDTRACE_MAX_BYTES"
QUEUE_ENV = "SCHEDTRACE_QUEUE"
OTEL_ENV = "SCHEDTRACE_OTEL"

_recorder = None  # the Recorder of this process, once registered


def register() -> None:
    if os.environ.get(FIXES_ENV):
        _install_fixes()
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return
    install_recorder(directory)


def _install_fixes() -> None:
    try:
        from schedtrace.replay.variants import install_fixes_from_env
    except ImportError as exc:
        logger.warning("schedtrace: %s is set but fixes cannot be loaded: %s", FIXES_ENV, exc)
        return
    install_fixes_from_env()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        logger.warning("schedtrace: %s=%r is not an integer; using %d", name, raw, default)
        return default


def otel_sinks() -> list[Sink]:
    if os.environ.get(OTEL_ENV) != "1":
        return []
    try:
        from schedtrace.tracer.export.otel_mirror import make_sink
    except ImportError as exc:
        logger.warning("schedtrace: %s=1 but the span mirror is unavailable: %s", OTEL_ENV, exc)
        return []
    sink = make_sink()
    return [sink] if sink is not None else []


def resolvable(target: str) -> bool:
    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def install_recorder(directory: str):
    """Create this process's recorder and register its hooks; returns it."""
    global _recorder
    if _recorder is not None:
        return _recorder
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from schedtrace.tracer.recorder.recorder import Recorder, make_hooks

    recorder = Recorder(
        directory,
        max_bytes=_env_int(MAX_BYTES_ENV, DEFAULT_MAX_BYTES),
        queue_size=_env_int(QUEUE_ENV, DEFAULT_QUEUE_SIZE),
        sink_factory=otel_sinks,
    )
    missing = []
    for target, hook in make_hooks(recorder):
        if resolvable(target):
            HookRegistry.register(target, hook, HookType.AROUND)
        else:
            missing.append(target)
    if missing:
        logger.warning(
            "schedtrace: hook points missing in this sglang, recording without them: %s",
            ", ".join(missing),
        )
    _recorder = recorder
    return recorder
