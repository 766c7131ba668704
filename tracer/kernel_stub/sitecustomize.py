"""Installs a lazy stand-in for ``sgl_kernel``, then runs any other sitecustomize.

Loaded by ``site`` at interpreter start because the sandbox puts this
directory first on ``PYTHONPATH``. Nothing happens until something imports
``sgl_kernel``: the real package is tried first, and only if it fails to load
(no libcuda on this machine) is it replaced by a module whose every attribute
is a ``MagicMock``, as sglang's own ``maybe_stub_sgl_kernel`` does. Other
imports are never touched.

This file shadows any other ``sitecustomize`` on ``sys.path`` (a distro's or a
virtual environment's), so it finds and executes the next one itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_PACKAGE = "sgl_kernel"


def _is_kernel_module(fullname: str) -> bool:
    return fullname == _PACKAGE or fullname.startswith(_PACKAGE + ".")


def _make_stub(module) -> None:
    from unittest.mock import MagicMock

    module.__path__ = []  # a package, so ``import sgl_kernel.x`` reaches the finder
    module.__getattr__ = lambda name: MagicMock(name=f"{module.__name__}.{name}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        _make_stub(module)


class _RealOrStubLoader(importlib.abc.Loader):
    """Runs the real ``sgl_kernel``; on ImportError/OSError turns it into the stub."""

    def __init__(self, finder: "_SglKernelFinder", real_loader) -> None:
        self._finder = finder
        self._real_loader = real_loader

    def create_module(self, spec):
        return self._real_loader.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self._real_loader.exec_module(module)
            self._finder.stubbing = False
        except (ImportError, OSError):
            self._finder.stubbing = True
            # Drop what the failed import left behind, then stub in place.
            for name in [m for m in sys.modules if m.startswith(_PACKAGE + ".")]:
                del sys.modules[name]
            keep = {"__name__", "__spec__", "__loader__", "__package__"}
            for attr in [a for a in vars(module) if a not in keep]:
                delattr(module, attr)
            _make_stub(module)


class _SglKernelFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.stubbing: bool | None = None  # None: not decided yet

    def find_spec(self, fullname, path=None, target=None):
        if not _is_kernel_module(fullname):
            return None
        if self.stubbing:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        if fullname != _PACKAGE or self.stubbing is False:
            return None  # the real package is loaded: let it import its own parts
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None or real.loader is None:
            self.stubbing = True
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        real.loader = _RealOrStubLoader(self, real.loader)
        return real


def _install_finder() -> None:
    if not any(isinstance(f, _SglKernelFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SglKernelFinder())


def _run_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin is None:
        return
    if os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_schedtrace_chained_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py reports sitecustomize errors the same way
        print(f"Error in sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)


_install_finder()
_run_next_sitecustomize()
