"""Installs the ``sgl_kernel`` stand-in, then runs any other sitecustomize.

Loaded by ``site`` at interpreter start because the sandbox puts this
directory first on ``PYTHONPATH`` (see ``schedtrace.tracer.kernel_stub``). This file
shadows any other ``sitecustomize`` on ``sys.path`` (a distro's or a virtual
environment's), so it finds and executes the next one itself.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

from schedtrace.tracer.kernel_stub import install

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


install()
_run_next_sitecustomize()
