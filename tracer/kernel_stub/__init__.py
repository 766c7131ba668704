"""A stand-in for the ``sgl_kernel`` import, for sglang processes on CPU.

``sgl_kernel`` ships CUDA-only native ops; importing it without libcuda fails,
and sglang imports it unconditionally. ``install()`` puts a meta-path finder
first: nothing happens until something imports ``sgl_kernel``; the real
package is tried first, and only if it fails to load (no libcuda) is it
replaced by a module whose every attribute is a ``MagicMock``, as sglang's
own ``maybe_stub_sgl_kernel`` does. Other imports are never touched.

Server processes get it from ``sitecustomize`` in ``STUB_DIR`` (first on
their ``PYTHONPATH``), so the scheduler and detokenizer children have it
too; replay calls ``install()`` in its own process. ``stubbed()`` says
whether the stand-in took the real package's place (the sandbox only adds
its CPU kernel stand-ins then); ``run_next_sitecustomize`` is for any
``sitecustomize`` that shadows another.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

STUB_DIR = Path(__file__).resolve().parent

_PACKAGE = "sgl_kernel"
_CUTE_DSL = "cutlass"


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


def _finder() -> _SglKernelFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, _SglKernelFinder)), None)


def install() -> None:
    """Install the finder in this process (idempotent)."""
    if _finder() is None:
        sys.meta_path.insert(0, _SglKernelFinder())


def hide_cute_dsl() -> None:
    """Make flashinfer's optional CuTe DSL (``cutlass``) look not installed here.

    It drives NVIDIA GPUs only, and importing it costs 1-5 s of every sglang
    import on this machine (docs/sandbox.md). flashinfer probes it with
    ``find_spec``, which answers None for a ``None`` entry in ``sys.modules``,
    and falls back as on any machine without ``nvidia-cutlass-dsl``; sglang's
    server code never imports it. For processes that run no kernel: the
    sandbox's servers and replay. Nothing changes if it is already imported.
    """
    sys.modules.setdefault(_CUTE_DSL, None)


def stubbed() -> bool:
    """Whether ``sgl_kernel`` is (or, once imported, will be) the stand-in here.

    Imports ``sgl_kernel`` to decide: the real package is tried first.
    """
    import sgl_kernel  # noqa: F401  (the finder decides on first import)

    finder = _finder()
    return bool(finder is not None and finder.stubbing)


def run_next_sitecustomize(this_file: str) -> None:
    """Run the ``sitecustomize`` that ``this_file`` shadows on ``sys.path``, if any.

    A ``sitecustomize`` first on ``PYTHONPATH`` hides a distro's or a virtual
    environment's own, so it finds and executes the next one itself.
    """
    here = os.path.dirname(os.path.realpath(this_file))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin is None:
        return
    if os.path.realpath(spec.origin) == os.path.realpath(this_file):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_schedtrace_chained_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py reports sitecustomize errors the same way
        print(f"Error in sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)
