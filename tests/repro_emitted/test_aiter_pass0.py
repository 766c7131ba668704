"""An over-capacity extend must stay on the chunked-KV path, in graph context too.

Found by schedtrace in aiter.trace, the aiter event after pass 0 (aiter), and shrunk by
delta debugging (seq_lens_sum 6000 → 2, capacity 4096 → 1), each step checked with the
real sglang code. On that state stock sglang picks MHA; with the aiter fix
(handle_attention_aiter) it picks MHA_CHUNKED_KV.

Fails on sglang 0.5.23 as released; passes with the aiter fix (`SCHEDTRACE_FIXES=aiter
python -m pytest` applies it, with schedtrace installed). Recorded with sglang 0.5.23.
Imports only sglang, pytest and the standard library; runs on CPU.
"""

from __future__ import annotations

from sglang.test.test_utils import maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # sgl_kernel needs libcuda; nothing here calls a kernel

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import (  # noqa: E402
    context as breakable_graph,
)
from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (  # noqa: E402
    context_manager as piecewise_graph,
)
from sglang.srt.models.deepseek_common.attention_backend_handler import (  # noqa: E402
    handle_attention_aiter,
)


# The forward batch at the aiter dispatch
FORWARD_MODE = ForwardMode.EXTEND
SEQ_LENS_SUM = 2
MAX_CHUNK_CAPACITY = 1


class ForwardBatchLengths:
    """What handle_attention_aiter reads from a ForwardBatch: the mode, the lengths, the capacity."""

    def __init__(self, forward_mode, seq_lens_sum: int, max_chunk_capacity: int) -> None:
        self.forward_mode = forward_mode
        self.seq_lens_cpu = [seq_lens_sum]
        self.extend_prefix_lens_cpu = None
        self.max_chunk_capacity = max_chunk_capacity

    def get_max_chunk_capacity(self) -> int:
        return self.max_chunk_capacity


def test_over_capacity_extend_stays_chunked(monkeypatch):
    """An over-capacity extend must stay on the chunked-KV path, in graph context too."""
    monkeypatch.setattr(piecewise_graph, "_in_tc_piecewise_cuda_graph", True)
    batch = ForwardBatchLengths(FORWARD_MODE, SEQ_LENS_SUM, MAX_CHUNK_CAPACITY)
    method = handle_attention_aiter(None, batch).name
    assert method == "MHA_CHUNKED_KV", (
        f"picked {method} for {SEQ_LENS_SUM} tokens over a capacity of {MAX_CHUNK_CAPACITY}: "
        "an over-capacity extend must stay on the chunked-KV path, in graph context too"
    )
