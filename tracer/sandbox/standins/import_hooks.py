"""Run a function right before, or right after, a named module executes.

Stand-ins must be in place at the moment sglang reads them (some names are
read at import time), yet installing them must not import torch or sglang
into every process that merely starts. ``before_import`` and
``after_import`` arm a meta-path finder that wraps the named module's own
loader: nothing happens until that module is imported, and other imports
are never touched.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType

Before = Callable[[], None]
After = Callable[[ModuleType], None]


class _HookLoader(importlib.abc.Loader):
    def __init__(self, real, before: list[Before], after: list[After]) -> None:
        self._real, self._before, self._after = real, before, after

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        for hook in self._before:
            hook()
        self._real.exec_module(module)
        for hook in self._after:
            hook(module)


class _HookFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.before: dict[str, list[Before]] = {}
        self.after: dict[str, list[After]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.before and fullname not in self.after:
            return None
        spec = _spec_from_others(self, fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HookLoader(spec.loader, self.before.pop(fullname, []), self.after.pop(fullname, []))
        return spec


def _spec_from_others(me: _HookFinder, fullname: str, path, target):
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _finder() -> _HookFinder:
    for finder in sys.meta_path:
        if isinstance(finder, _HookFinder):
            return finder
    finder = _HookFinder()
    sys.meta_path.insert(0, finder)
    return finder


def before_import(module: str, hook: Before) -> None:
    """Call ``hook()`` just before ``module`` first executes (now, if it already has)."""
    if module in sys.modules:
        hook()  # too late to precede it; still better than never
        return
    _finder().before.setdefault(module, []).append(hook)


def after_import(module: str, hook: After) -> None:
    """Call ``hook(module)`` just after ``module`` first executes (now, if it already has)."""
    if module in sys.modules:
        hook(sys.modules[module])
        return
    _finder().after.setdefault(module, []).append(hook)
