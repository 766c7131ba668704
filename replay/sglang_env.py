"""Make sglang importable in this process before replay imports it.

On a machine without libcuda, sglang's ``import sgl_kernel`` fails (always
with ``SGLANG_USE_CPU_ENGINE=1``). The sandbox server gets the stand-in
through ``tracer/kernel_stub/sitecustomize.py`` on ``PYTHONPATH``; replay
runs in the user's own process, so it installs the same finder here. The
real ``sgl_kernel`` is still tried first; only if it fails to load is it
stubbed. Replay never calls a kernel.
"""

from __future__ import annotations

import importlib.util
import sys

from tracer.kernel_stub import STUB_DIR

_MODULE = "_schedtrace_kernel_stub"


def ensure_sglang_importable() -> None:
    if _MODULE in sys.modules or "sgl_kernel" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(_MODULE, STUB_DIR / "sitecustomize.py")
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    spec.loader.exec_module(module)  # installs the meta-path finder
