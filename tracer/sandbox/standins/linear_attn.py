"""Shape-correct torch stand-ins for the linear-attention kernels on CPU.

Qwen3-Next's gated-delta-net (GDN) and Kimi-Linear's delta-attention (KDA)
layers call sgl_kernel's CPU ops: the causal conv1d (prefill and decode),
the gated delta rule (chunked prefill and recurrent decode) and the GDN
gate; sglang's linear-attention backends read some of them at import time,
whichever model runs. With the ``sgl_kernel`` stub these are MagicMocks
that return no tensors. Others go to Triton kernels that have no CPU
driver ("0 active drivers"): KDA's prefill conv and chunked rule, the gated
RMSNorm and the MoE shared-expert sigmoid gate. These stand-ins return
tensors of the shapes the model expects, computed cheaply; they leave the
conv and SSM states in the mamba pool as they are. They are not numerically
faithful, which scheduling does not need: the pool slots themselves (which
requests hold which state, their copy-on-write and clears) stay real.
"""

from __future__ import annotations

from types import ModuleType

# The modules that read these kernels, at import time; the stand-ins must precede them.
KERNEL_READERS = (
    "sglang.srt.layers.attention.linear.gdn_backend",
    "sglang.srt.layers.attention.linear.kernels.gdn_triton",
    "sglang.srt.layers.attention.linear.kda_backend",
)
GATED_NORM_MODULE = "sglang.kernels.ops.attention.fla.fused_norm_gate"
ELEMENTWISE_MODULE = "sglang.kernels.ops.elementwise.elementwise"
KDA_BACKEND_MODULE = "sglang.srt.layers.attention.linear.kda_backend"
KDA_KERNEL_MODULE = "sglang.srt.layers.attention.linear.kernels.kda_triton"


def _activate(x, activation):
    import torch.nn.functional as F

    return F.silu(x) if activation in ("silu", "swish") else x


def causal_conv1d_fn(x, weight, bias=None, activation=None, *args, **kwargs):
    """Prefill conv over ``x`` [dim, tokens]: same shape out."""
    return _activate(x.clone(), activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, *args, **kwargs):
    """Decode conv over ``x`` [batch, dim] (or [batch, dim, tokens]): same shape out."""
    return _activate(x.clone(), activation)


def fused_gdn_gating(A_log, a, b, dt_bias, *args, **kwargs):
    """The gate: (g [1, tokens, heads] fp32, beta [1, tokens, heads])."""
    import torch
    import torch.nn.functional as F

    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g.unsqueeze(0), torch.sigmoid(b).unsqueeze(0)


def chunk_gated_delta_rule(q=None, k=None, v=None, g=None, beta=None, initial_state=None, *args, **kwargs):
    """Chunked prefill: (output like ``v``, final state, per-chunk states None)."""
    return v.clone(), initial_state, None


def chunk_kda(q=None, k=None, v=None, *args, output_intermediate_states=False, **kwargs):
    """KDA chunked prefill: output like ``v`` (and no per-chunk states)."""
    out = v.clone()
    return (out, None) if output_intermediate_states else out


def fused_sigmoid_gating_delta_rule_update(A_log=None, dt_bias=None, q=None, k=None, v=None, *args, **kwargs):
    """Recurrent decode over ``v`` [1, batch, heads, dim]: the same layout out (KDA reads it so)."""
    return v.clone()


def gated_rms_norm(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """``FusedRMSNormGated.forward`` in torch: RMSNorm(x) * weight * act(g)."""
    import torch

    dtype = x.dtype
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
    if self.weight is not None:
        out = out * self.weight.float()
    gate = torch.sigmoid(g.float()) if self.activation == "sigmoid" else _activate(g.float(), "silu")
    return (out * gate).to(dtype)


def sigmoid_gate_mul(hidden_states, gate_weight, shared_output, output, *, do_add: bool) -> None:
    """The shared-expert gate in torch: output (+)= sigmoid(hidden . w) * shared."""
    import torch

    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float()).unsqueeze(-1)
    result = gate * shared_output.float()
    if do_add:
        result += output.float()
    output.copy_(result.to(output.dtype))


MAMBA_KERNELS = {  # sgl_kernel.mamba attributes
    "causal_conv1d_fn_cpu": causal_conv1d_fn,
    "causal_conv1d_update_cpu": causal_conv1d_update,
    "chunk_gated_delta_rule_cpu": chunk_gated_delta_rule,
}
TORCH_OPS = {  # torch.ops.sgl_kernel attributes
    "fused_gdn_gating_cpu": fused_gdn_gating,
    "fused_sigmoid_gating_delta_rule_update_cpu": fused_sigmoid_gating_delta_rule_update,
}


def _provide_kernels() -> None:
    from schedtrace.tracer.kernel_stub import stubbed

    if not stubbed():
        return  # a real sgl_kernel (a CPU build) has its own kernels
    import sgl_kernel.mamba as mamba
    import torch

    for name, fn in MAMBA_KERNELS.items():
        setattr(mamba, name, fn)
    for name, fn in TORCH_OPS.items():
        setattr(torch.ops.sgl_kernel, name, fn)


def _patch_norm(module: ModuleType) -> None:
    module.FusedRMSNormGated.forward = gated_rms_norm


def _patch_kda_backend(module: ModuleType) -> None:
    module.causal_conv1d_fn = causal_conv1d_fn  # KDA's prefill conv is Triton on every platform


def _patch_kda_kernels(module: ModuleType) -> None:
    # On CPU this module imports no kernels at all; give it the two it calls.
    module.chunk_kda = chunk_kda
    module.fused_sigmoid_gating_delta_rule_update = fused_sigmoid_gating_delta_rule_update


def _patch_gate(module: ModuleType) -> None:
    module._launch_fused_gate_sigmoid_mul = sigmoid_gate_mul  # what both public gate functions call


def install() -> None:
    from schedtrace.tracer.sandbox.standins.import_hooks import after_import, before_import

    for reader in KERNEL_READERS:
        before_import(reader, _provide_kernels)
    after_import(GATED_NORM_MODULE, _patch_norm)
    after_import(ELEMENTWISE_MODULE, _patch_gate)
    after_import(KDA_BACKEND_MODULE, _patch_kda_backend)
    after_import(KDA_KERNEL_MODULE, _patch_kda_kernels)
