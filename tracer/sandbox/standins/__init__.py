"""The sandbox's stand-ins for what a GPU would run, and only that.

Each ``StandIn`` names what it replaces and why; docs/sandbox.md is the
prose version. Pools, allocators, the radix cache, ``ForwardBatch``,
sampling and the request lifecycle are never stood in for: they are what
the scheduler reads.

A server process installs the stand-ins its model needs at interpreter
start (``schedtrace.tracer.sandbox.site``'s ``sitecustomize`` calls
``install_from_env``), named in ``STANDINS_ENV``; each one arms an import
hook and touches nothing until sglang imports the module it replaces a part
of.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import STANDINS_ENV  # a comma list of the names below


@dataclass(frozen=True)
class StandIn:
    name: str
    title: str  # what it stands in for, in a few words
    replaces: str  # what runs instead of the real thing
    why: str  # what fails on this CPU machine without it
    module: str  # has install(); "" for the two always installed (by schedtrace.tracer.kernel_stub)


SGL_KERNEL_IMPORT = StandIn(
    "sgl-kernel-import",
    "the sgl_kernel import",
    "the sgl_kernel import: a module whose attributes are MagicMocks",
    "sgl_kernel ships CUDA-only native ops and fails to import without libcuda",
    "",
)
CUTE_DSL_ABSENT = StandIn(
    "cute-dsl-absent",
    "flashinfer's CuTe DSL",
    "flashinfer's optional CuTe DSL (cutlass) looks not installed, so flashinfer takes its documented fallback",
    "nothing fails: it targets NVIDIA GPUs only, and its import costs 1-5 s of every sglang import here",
    "",
)
DEVICE = StandIn(
    "device",
    "the device lookup",
    "torch.get_device_module() with no argument answers torch.cpu",
    "this CUDA torch build names torch.cuda, whose current_device() fails without a driver",
    "schedtrace.tracer.sandbox.standins.device",
)
LINEAR_ATTN_KERNELS = StandIn(
    "linear-attn-kernels",
    "the linear-attention kernels",
    "shape-correct torch versions of the GDN/KDA kernels (causal conv1d, delta rule, gates), "
    "the gated RMSNorm and the MoE shared-expert gate; the mamba pool's slots stay real",
    "the stub's MagicMocks return no tensors, and the Triton ones have no CPU driver",
    "schedtrace.tracer.sandbox.standins.linear_attn",
)
FORWARD = StandIn(
    "forward",
    "the model forward",
    "ModelRunner._forward_raw: one-hot logits on a deterministic next token, "
    "EOS after a request-dependent number of steps; the mamba COW/clear still runs",
    "the real forward fails on CPU (gpt-oss: no sinks in torch_native; DP attention: idle ranks)",
    "schedtrace.tracer.sandbox.standins.forward",
)
NO_PYNCCL = StandIn(
    "no-pynccl",
    "pynccl between ranks",
    "GroupCoordinator(use_pynccl=False): collectives run on the real gloo groups",
    "pynccl is turned on for CPU groups and fails: 'Expected a cuda device, but got: cpu'",
    "schedtrace.tracer.sandbox.standins.ranks",
)

MLA_ABSORBED = StandIn(
    "mla-absorbed",
    "the MLA attention path choice",
    "the attention path choice for MLA layers on torch_native: always the absorbed (latent) path",
    "torch_native falls back to Triton's choice, MHA prefill, whose head sizes miss the latent KV cache",
    "schedtrace.tracer.sandbox.standins.mla",
)

STAND_INS: dict[str, StandIn] = {
    s.name: s for s in (SGL_KERNEL_IMPORT, CUTE_DSL_ABSENT, DEVICE, LINEAR_ATTN_KERNELS, MLA_ABSORBED, FORWARD, NO_PYNCCL)
}


def check_names(names: Iterable[str]) -> tuple[str, ...]:
    names = tuple(names)
    unknown = [n for n in names if n not in STAND_INS]
    if unknown:
        raise UsageError(f"unknown sandbox stand-in(s) {', '.join(unknown)}; known: {', '.join(STAND_INS)}")
    return names


def env_value(names: Iterable[str]) -> str:
    return ",".join(check_names(names))


def names_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    raw = environ.get(STANDINS_ENV, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def install(names: Iterable[str]) -> None:
    """Arm the named stand-ins in this process (each is idempotent)."""
    for name in check_names(names):
        module = STAND_INS[name].module
        if module:
            importlib.import_module(module).install()


def install_from_env(environ: Mapping[str, str] = os.environ) -> None:
    install(names_from_env(environ))
