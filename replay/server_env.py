"""The recorded server's environment, installed around each replayed pass.

The recorded ``Header.mamba_chunk_grid`` is an environment input like the KV
counts: sglang reads it through the module-level
``schedule_policy.mamba_prefill_chunk_grid()`` (in ``PrefillAdder.__init__``)
and, once at scheduler start, through ``Scheduler.init_mamba_truncation_align``.
Both lookups answer the recorded grid while a replay call runs
(``recorded_grid``). Publishing config that makes sglang compute it instead
would need DCP on in the parallel config and the mamba extra buffer in the
exec config; other code on the pass reads those too (DCP KV-shard scratch,
mamba budgets) for state a trace does not hold, so replay injects exactly the
one recorded value and nothing else.

``PublishedConfig`` is the server's runtime config, swapped in per call;
``recorded_constants`` are the import-time settings (``Header.settings``) the
server had otherwise than this process, set per call with ``swap_constants``,
as are the answers of the settings sglang reads per request (``per_request_envs``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator
from typing import Any, Final

from schedtrace.tracer.analysis.settings import MODULE_SETTINGS, PER_REQUEST_ENVS

_INHERITED: Final = object()  # an attribute the owner's class gives, not the owner


@contextlib.contextmanager
def recorded_grid(module: Any, grid: int) -> Iterator[None]:
    """``module.mamba_prefill_chunk_grid()`` answers ``grid`` inside the block."""
    original = module.__dict__["mamba_prefill_chunk_grid"]
    module.mamba_prefill_chunk_grid = lambda: grid
    try:
        yield
    finally:
        module.mamba_prefill_chunk_grid = original


class PublishedConfig:
    """The sglang runtime config this trace's server ran with, swapped in per call.

    ``override_server_args`` builds and publishes a dummy ``ServerArgs``; that
    costs milliseconds, so it is built once and later calls only swap the
    context's slots (a few attribute stores) in and out.
    """

    # The published config lives in four of the context's slots and the parallel context's ``_config``:
    # read and stored by name (``_capture``, ``swap_out``), a third of the cost of a loop over names.

    def __init__(self, fields: dict[str, Any]) -> None:
        from sglang.srt.runtime_context import get_context

        self._context = get_context()
        with self._context.override_server_args(**fields):
            self._saved = self._capture()

    def _capture(self) -> tuple:
        ctx = self._context
        return ctx._server_args, ctx._config_bags, ctx._overrides_log, ctx._publish_role, ctx.parallel._config

    def swap_in(self) -> tuple:
        """Install the trace's config; returns what to give ``swap_out``."""
        previous = self._capture()
        self.swap_out(self._saved)
        return previous

    def swap_out(self, previous: tuple) -> None:
        ctx = self._context
        ctx._server_args, ctx._config_bags, ctx._overrides_log, ctx._publish_role, ctx.parallel._config = previous

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = self.swap_in()
        try:
            yield
        finally:
            self.swap_out(previous)


def recorded_constants(settings: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    """(module, constant, recorded value) for each import-time setting the server had otherwise."""
    out = []
    for env_name, (module_name, attr) in MODULE_SETTINGS.items():
        if env_name not in settings:
            continue
        module = importlib.import_module(module_name)
        value = settings[env_name]
        if hasattr(module, attr) and getattr(module, attr) != value:
            out.append((module, attr, value))
    return out


def per_request_envs(settings: dict[str, Any]) -> list[tuple[Any, str, Any]]:
    """(env field, "get", a getter of the recorded value) for each setting in ``PER_REQUEST_ENVS``.

    sglang reads these on every request of a pass (``envs.NAME.get()``, an ``os.getenv`` each: a fifth of
    an lpm pass over a long queue); the answer is fixed for a replay, so it is given without the look-up:
    the value the server recorded, else (a trace from before settings were recorded) sglang's default,
    never this process's environment.
    """
    from sglang.srt.environ import envs

    out = []
    for name in PER_REQUEST_ENVS:
        field = getattr(envs, name, None)
        if field is None:
            continue
        value = settings[name] if name in settings else field._resolve_default()
        out.append((field, "get", functools.partial(_answer, value)))
    return out


def _answer(value: Any) -> Any:
    return value


def swap_constants(constants: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """Set each constant; returns what restores them (empty when the server's are this process's).

    The owners are modules and ``EnvField`` instances, where a store into ``__dict__`` is what
    ``setattr`` does (no data descriptor stands in the way), at half its cost; a class's namespace
    (read-only) goes through ``setattr``."""
    previous = []
    for owner, attr, value in constants:
        held = owner.__dict__
        previous.append((owner, attr, held.get(attr, _INHERITED)))
        if type(held) is not dict:
            _set_through(owner, attr, value)
        elif value is _INHERITED:
            held.pop(attr, None)  # the class's again (a method an instance's attribute stood in for)
        else:
            held[attr] = value
    return previous


def _set_through(owner: Any, attr: str, value: Any) -> None:
    if value is _INHERITED:
        delattr(owner, attr)
    else:
        setattr(owner, attr, value)
