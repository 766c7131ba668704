"""A stand-in for the ``sgl_kernel`` import, for sglang processes on CPU.

``sgl_kernel`` ships CUDA-only native ops; importing it without libcuda fails,
and sglang imports it unconditionally. Putting ``STUB_DIR`` first on
``PYTHONPATH`` makes every Python process started with that environment
(the server and its scheduler and detokenizer children) run this directory's
``sitecustomize``, which installs the stand-in.
"""

from __future__ import annotations

from pathlib import Path

STUB_DIR = Path(__file__).resolve().parent
