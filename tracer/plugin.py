"""sglang general plugin entry point (``sglang.srt.plugins`` -> ``register``).

sglang calls ``register()`` in every process it starts (tokenizer manager,
scheduler, detokenizer) and then ``HookRegistry.apply_hooks()``.

Environment (names and defaults: ``schedtrace.tracer.contract.names``):

* ``SCHEDTRACE_FIXES`` -- install the named scheduler fixes
  (``schedtrace.arms.variants.install_fixes_from_env``) before anything else;
* ``SCHEDTRACE_DIR`` -- record: without it no recorder hook is installed. A
  directory that cannot hold files is reported here, in one line, and the
  variable is removed from this process's environment, so the processes
  sglang starts from it inherit "off" and nothing pretends to trace;
* ``SCHEDTRACE_RUN_ID`` -- set here when unset (``naming.ensure_run_id``):
  the launching process loads the plugin first, so every rank inherits it;
* ``SCHEDTRACE_FSYNC_MS``, ``SCHEDTRACE_CLOCK_S``, ``SCHEDTRACE_MAX_TOTAL_BYTES``,
  ``SCHEDTRACE_MODE``/``SCHEDTRACE_RING_BYTES``, ``SCHEDTRACE_CONTROL_FILE`` --
  the writer's policy (``recorder.policy.WriterPolicy.from_env``);
* ``SCHEDTRACE_MAX_BYTES`` -- rotate to a new part past this size (``DEFAULT_MAX_BYTES``);
* ``SCHEDTRACE_QUEUE`` -- writer queue length; a full queue drops (``DEFAULT_QUEUE_SIZE``);
* ``SCHEDTRACE_OTEL`` (a boolean: 1/true/yes/on) -- mirror records as spans
  (``schedtrace.tracer.export.otel_mirror``).

Hook targets are resolved here first, so a hook point missing from the
installed sglang is left out instead of raising in ``HookRegistry``. One
warning per process says what is off: the installed sglang when it is not
the pinned release, and every hook point it lacks.
"""

from __future__ import annotations

import logging
import os
import pkgutil
from collections.abc import Iterable

from schedtrace.tracer.contract.names import (
    DEFAULT_MAX_BYTES,
    DEFAULT_QUEUE_SIZE,
    DIR_ENV,
    FIXES_ENV,
    MAX_BYTES_ENV,
    OTEL_ENV,
    PINNED_SGLANG,
    QUEUE_ENV,
    env_flag,
    env_int,
)
from schedtrace.tracer.contract.versions import installed_version
from schedtrace.tracer.recorder.naming import directory_problem, ensure_run_id
from schedtrace.tracer.recorder.policy import WriterPolicy
from schedtrace.tracer.recorder.writer_thread import Sink

logger = logging.getLogger(__name__)

_recorder = None  # the Recorder of this process, once registered


def register() -> None:
    if os.environ.get(FIXES_ENV):
        _install_fixes()
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return
    problem = directory_problem(directory)
    if problem is not None:
        logger.error("schedtrace: %s=%s cannot hold traces: %s; recording is off", DIR_ENV, directory, problem)
        os.environ.pop(DIR_ENV, None)  # the processes started from here inherit "off" and stay quiet
        return
    install_recorder(directory, run_id=ensure_run_id())


def _install_fixes() -> None:
    try:
        from schedtrace.arms.variants import install_fixes_from_env
    except ImportError as exc:
        logger.warning("schedtrace: %s is set but fixes cannot be loaded: %s", FIXES_ENV, exc)
        return
    install_fixes_from_env()


def otel_sinks() -> list[Sink]:
    if not env_flag(OTEL_ENV):
        return []
    try:
        from schedtrace.tracer.export.otel_mirror import make_sink
    except ImportError as exc:
        logger.warning("schedtrace: %s is on but the span mirror is unavailable: %s", OTEL_ENV, exc)
        return []
    sink = make_sink()
    return [sink] if sink is not None else []


def resolvable(target: str) -> bool:
    try:
        pkgutil.resolve_name(target)
    except Exception:
        return False
    return True


def compatibility_warning(installed: str, missing: list[str]) -> str | None:
    """The one warning for an sglang other than the pinned one, or with hook points missing."""
    if installed == PINNED_SGLANG and not missing:
        return None
    release = f"sglang {installed}" + ("" if installed == PINNED_SGLANG else f" (schedtrace is pinned to {PINNED_SGLANG})")
    if not missing:
        return f"schedtrace: {release}: every hook point resolved, but recording is untested on it"
    return f"schedtrace: {release}: hook points missing, recording without them: {', '.join(missing)}"


def missing_hook_points(targets: Iterable[str], installed: str) -> list[str]:
    """The targets that do not resolve here; logs ``compatibility_warning`` once if there is one."""
    missing = [target for target in targets if not resolvable(target)]
    message = compatibility_warning(installed, missing)
    if message is not None:
        logger.warning(message)
    return missing


def install_recorder(directory: str, *, run_id: str = "", policy: WriterPolicy | None = None):
    """Create this process's recorder and register its hooks; returns it."""
    global _recorder
    if _recorder is not None:
        return _recorder
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from schedtrace.tracer.recorder.hooks import make_hooks
    from schedtrace.tracer.recorder.lifecycle import Recorder

    recorder = Recorder(
        directory,
        max_bytes=env_int(MAX_BYTES_ENV, DEFAULT_MAX_BYTES),
        queue_size=env_int(QUEUE_ENV, DEFAULT_QUEUE_SIZE),
        sink_factory=otel_sinks,
        policy=policy or WriterPolicy.from_env(),
        run_id=run_id,
    )
    hooks = make_hooks(recorder)
    missing = set(missing_hook_points([target for target, _ in hooks], installed_version("sglang")))
    for target, hook in hooks:
        if target not in missing:
            HookRegistry.register(target, hook, HookType.AROUND)
    _recorder = recorder
    return recorder
