"""sglang's aiter dispatch on a recorded ``aiter`` event: which ``AttnForwardMethod``
``handle_attention_aiter`` picks under a variant (``PassDriver.decide_aiter``). No aiter import:
the dispatch reads only the batch's mode, lengths and chunk capacity, and the graph flags."""

from __future__ import annotations

from contextlib import AbstractContextManager

from schedtrace.replay.pass_standins import AiterBatch
from schedtrace.replay.server_env import PublishedConfig
from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.schema import Aiter


def aiter_method(event: Aiter, variant: str, config: PublishedConfig, lock: AbstractContextManager) -> str:
    """The method's name, with the recorded server's ``config`` installed and ``lock`` held."""
    from schedtrace.arms.variants import applied  # imported on first use, as sglang is
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import context as bcg
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
        context_manager as pcg,
    )
    from sglang.srt.models.deepseek_common import attention_backend_handler as handler

    try:
        mode = ForwardMode[event.forward_mode]
    except KeyError:
        raise ReplayStateError(f"aiter event: unknown forward mode {event.forward_mode!r}") from None
    batch = AiterBatch(mode, event.seq_lens_sum, event.max_chunk_capacity)
    with lock, config.installed(), applied(variant):
        saved = (pcg._in_tc_piecewise_cuda_graph, bcg._in_breakable_cuda_graph)
        pcg._in_tc_piecewise_cuda_graph = event.in_piecewise_graph
        bcg._in_breakable_cuda_graph = event.in_breakable_graph
        try:
            method = handler.handle_attention_aiter(None, batch)
        finally:
            pcg._in_tc_piecewise_cuda_graph, bcg._in_breakable_cuda_graph = saved
    return method.name
