"""The stand-in for GPU collectives between ranks: no pynccl on CPU.

``init_model_parallel_group`` turns pynccl on for every group on the CPU
platform, and ``PyNcclCommunicator`` then fails ("Expected a cuda device,
but got: cpu"). With ``use_pynccl=False`` each ``GroupCoordinator`` keeps
its real torch.distributed (gloo) group, so all-reduce, broadcast and the
DP-attention token-count gather between ranks are real.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

PARALLEL_STATE_MODULE = "sglang.srt.distributed.parallel_state"


def _patch(module: ModuleType) -> None:
    real_init = module.GroupCoordinator.__init__
    if getattr(real_init, "_schedtrace_stand_in", False):
        return

    signature = inspect.signature(real_init)

    @functools.wraps(real_init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments["use_pynccl"] = False
        return real_init(*bound.args, **bound.kwargs)

    __init__._schedtrace_stand_in = True
    module.GroupCoordinator.__init__ = __init__


def install() -> None:
    from schedtrace.tracer.sandbox.standins.import_hooks import after_import

    after_import(PARALLEL_STATE_MODULE, _patch)
