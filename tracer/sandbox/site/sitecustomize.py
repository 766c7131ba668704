"""Arms the sandbox's stand-ins in every server process, before sglang imports.

``site`` loads this at interpreter start because ``SandboxServer`` puts this
folder first on ``PYTHONPATH``; the scheduler and detokenizer children,
forked, inherit what it installed (spawned, they run it again). It installs the ``sgl_kernel`` import stand-in, hides the
CuTe DSL (``kernel_stub.hide_cute_dsl``), then the
stand-ins named in ``SCHEDTRACE_SANDBOX_STANDINS``, makes sglang fork its
children instead of spawning them (``start_method``), then runs the
``sitecustomize`` it shadows.
"""

from __future__ import annotations

from schedtrace.tracer.kernel_stub import hide_cute_dsl, install, run_next_sitecustomize
from schedtrace.tracer.sandbox import start_method
from schedtrace.tracer.sandbox.standins import install_from_env

install()
hide_cute_dsl()
install_from_env()
start_method.install_from_env()
run_next_sitecustomize(__file__)
