"""Make sglang importable in this process before replay imports it.

On a machine without libcuda, sglang's ``import sgl_kernel`` fails (always
with ``SGLANG_USE_CPU_ENGINE=1``). The sandbox server gets the stand-in
through ``tracer/kernel_stub/sitecustomize.py`` on ``PYTHONPATH``; replay
runs in the user's own process, so it installs the same finder here. The
real ``sgl_kernel`` is still tried first; only if it fails to load is it
stubbed. Replay never calls a kernel.
"""

from __future__ import annotations

import logging
import warnings

from schedtrace.tracer.kernel_stub import hide_cute_dsl, install


def ensure_sglang_importable() -> None:
    install()
    hide_cute_dsl()  # a GPU-only DSL whose import costs seconds; replay runs no kernel
    # sglang logs and warns at import about GPU-only features (CUDA arch, AWQ,
    # GGUF, Triton) on any machine without them; replay uses none of them.
    logging.getLogger("sglang.kernels.jit.utils.arch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.")
