"""MLA on the torch-native backend: always the absorbed (latent) path.

DeepSeek-style MLA layers (Kimi-Linear's full-attention layers) pick, per
batch, between an MHA path (expanded keys and values) and the absorbed MLA
path (attention over the latent KV cache). The torch-native backend has no
handler of its own and falls back to Triton's choice, MHA for prefill,
whose head sizes do not match the latent KV cache torch-native reads. The
absorbed path is the one decode uses; prefill takes it too.
"""

from __future__ import annotations

from types import ModuleType

HANDLER_MODULE = "sglang.srt.models.deepseek_common.attention_backend_handler"
BACKEND = "torch_native"


def _register(module: ModuleType) -> None:
    def handle_attention_torch_native(attn, forward_batch):
        return module.AttnForwardMethod.MLA

    module.AttentionBackendRegistry.register(BACKEND, handle_attention_torch_native)


def install() -> None:
    from schedtrace.tracer.sandbox.standins.import_hooks import after_import

    after_import(HANDLER_MODULE, _register)
