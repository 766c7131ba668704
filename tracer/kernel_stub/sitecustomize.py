"""Installs the ``sgl_kernel`` stand-in, hides the CuTe DSL, then runs any other sitecustomize.

Loaded by ``site`` at interpreter start when this directory is first on
``PYTHONPATH`` (see ``schedtrace.tracer.kernel_stub``). This file shadows any
other ``sitecustomize`` on ``sys.path`` (a distro's or a virtual
environment's), so it runs the next one itself.
"""

from __future__ import annotations

from schedtrace.tracer.kernel_stub import hide_cute_dsl, install, run_next_sitecustomize

install()
hide_cute_dsl()
run_next_sitecustomize(__file__)
