"""The device lookup stand-in: ``torch.get_device_module()`` answers ``torch.cpu``.

This torch build is compiled for CUDA, so with no device argument it names
``torch.cuda`` even on a machine without a GPU, and some model constructors
(Qwen3-Next's gated norm) ask it for ``current_device()``, which then fails
with "Found no NVIDIA driver". On the CPU sandbox the current device is the
CPU; an explicit device argument is passed through unchanged.
"""

from __future__ import annotations

import functools
from types import ModuleType


def _patch(torch: ModuleType) -> None:
    real = torch.get_device_module
    if getattr(real, "_schedtrace_stand_in", False):
        return

    @functools.wraps(real)  # torch.compile looks up get_device_module.__wrapped__
    def get_device_module(device=None):
        return torch.cpu if device is None else real(device)

    get_device_module._schedtrace_stand_in = True
    torch.get_device_module = get_device_module


def install() -> None:
    from schedtrace.tracer.sandbox.standins.import_hooks import after_import

    after_import("torch", _patch)
