"""``Header.settings``: every setting sglang's scheduling code reads beyond ``ServerArgs``.

Server arguments are read from the server's ``ServerArgs`` (what sglang
resolved); environment settings as sglang itself holds them: ``envs.NAME``
for the ones it declares, and the module constants of ``schedule_policy`` and
``scheduler`` for the ones they read once at import (``IN_BATCH_PREFIX_CACHING_*``,
``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, ``SGLANG_TEST_RETRACT``). ``tracer.analysis.settings``
names them all and says which the replay applies; tests/test_settings.py
walks sglang's scheduling modules so a new release cannot add one silently.
"""

from __future__ import annotations

import sys
from typing import Any

from schedtrace.tracer.analysis.settings import ENV_SETTINGS, MODULE_SETTINGS, SERVER_SETTINGS

Value = int | float | str | bool | None


def _plain(value: Any) -> Value:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def read_settings(args: Any) -> dict[str, Value]:
    """The recorded settings of a server whose ``ServerArgs`` are ``args``."""
    out: dict[str, Value] = {}
    for name in SERVER_SETTINGS:
        if hasattr(args, name):
            out[name] = _plain(getattr(args, name))
    try:
        from sglang.srt.environ import envs
    except Exception:  # another sglang: record what the arguments hold
        envs = None
    for name in ENV_SETTINGS:
        env = getattr(envs, name, None) if envs is not None else None
        if env is not None:
            try:
                out[name] = _plain(env.get())
            except Exception:  # a value sglang itself cannot parse: it would fail too
                out[name] = None
    for env_name, (module_name, attr) in MODULE_SETTINGS.items():
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attr):
            out[env_name] = _plain(getattr(module, attr))
    return out
