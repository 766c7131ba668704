"""The models the CPU sandbox can serve: one registry entry per family.

Each ``SandboxModel`` carries its tiny ``config.json`` (a folder under
``assets/``, with the shared tiny tokenizer; weights are dummy), the launch
flags its family needs on CPU (chosen here, not by the user), what runs
real and which stand-ins (``schedtrace.tracer.sandbox.standins``) replace
the rest. ``model("hybrid-mamba")`` looks one up; ``MODELS`` lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.names import MAMBA_NO_BUFFER
from schedtrace.tracer.sandbox.assets.make_tiny_model import ASSETS_DIR
from schedtrace.tracer.sandbox.standins import (
    CUTE_DSL_ABSENT,
    DEVICE,
    FORWARD,
    LINEAR_ATTN_KERNELS,
    MLA_ABSORBED,
    NO_PYNCCL,
    SGL_KERNEL_IMPORT,
    STAND_INS,
    check_names,
)

# What every family shares: the scheduler, pools, radix cache, ForwardBatch,
# sampling and the request lifecycle, on sglang's own CPU code.
ALWAYS_REAL: tuple[str, ...] = (
    "scheduler", "KV and request pools", "allocators", "radix cache",
    "ForwardBatch", "sampling", "request lifecycle",
)

# Few running slots, big chunks and a small KV pool: with ~48 concurrent
# 1.5k-4.5k-token prompts the scheduler chunks prefills, runs near full token
# usage and has to queue and retract. This is the load the demo traces.
KV_PRESSURE_ARGS: tuple[str, ...] = (
    "--max-running-requests", "12",
    "--chunked-prefill-size", "8192",
    "--max-total-tokens", "40000",
)

# The hybrids' overload, sized for their slower forwards: 1k chunks and a
# 16k-token pool, so a dozen or two 0.5k-2.5k-token prompts chunk, queue and fill it.
HYBRID_PRESSURE_ARGS: tuple[str, ...] = (
    "--chunked-prefill-size", "1024",
    "--max-total-tokens", "16384",
)

# The mamba state pool defaults to ~1.4M slots (6.5 GB) on CPU; this keeps it
# small (sglang caps running requests at a third of it: 3 slots per request).
MAMBA_CACHE_SLOTS = 48


@dataclass(frozen=True)
class SandboxModel:
    name: str
    family: str  # what it is, for --list-models
    asset: str  # folder under assets/ holding config.json and the tokenizer
    real_forward: bool  # the model's own forward runs (with kernel stand-ins)
    stand_ins: tuple[str, ...]  # names in STAND_INS, beyond the sgl_kernel import stand-in
    launch_args: tuple[str, ...] = ()
    overload_args: tuple[str, ...] = KV_PRESSURE_ARGS  # what --overload adds for this model
    hybrid: str | None = None  # None, "mamba" or "swa": what the scheduler's pools are

    @property
    def model_dir(self) -> Path:
        return ASSETS_DIR / self.asset

    def stand_ins_for(self, tp: int = 1, dp: int = 1, stand_in_forward: bool = False,
                      pp: int = 1) -> tuple[str, ...]:
        """Stand-ins at ``tp`` ranks with ``dp`` attention ranks and ``pp`` stages
        (``stand_in_forward``: for speed)."""
        extra: list[str] = []
        if tp * pp > 1:
            extra.append(NO_PYNCCL.name)
        if dp > 1 or stand_in_forward:
            extra.append(FORWARD.name)  # an idle DP rank's empty batch breaks the real forward
        return check_names(dict.fromkeys([*self.stand_ins, *extra]))  # ordered, no repeats

    def runs_real(self, stand_ins: Sequence[str] | None = None) -> tuple[str, ...]:
        """What runs on sglang's own code under ``stand_ins`` (default: the model's own)."""
        stand_ins = self.stand_ins if stand_ins is None else stand_ins
        forward = self.real_forward and FORWARD.name not in stand_ins
        return (("model forward",) if forward else ()) + ALWAYS_REAL

    def stood_in_for(self, stand_ins: Sequence[str] | None = None) -> tuple[str, ...]:
        """What is stood in for, in a few words each (the two always installed first)."""
        stand_ins = self.stand_ins if stand_ins is None else stand_ins
        return tuple(STAND_INS[n].title for n in (SGL_KERNEL_IMPORT.name, CUTE_DSL_ABSENT.name, *stand_ins))

    def describe(self, stand_ins: Sequence[str] | None = None) -> str:
        """One line for --list-models: what it is, what runs real, what is stood in for."""
        return (
            f"{self.name}: {self.family}. Real: {', '.join(self.runs_real(stand_ins))}. "
            f"Stood in for: {', '.join(self.stood_in_for(stand_ins))}."
        )


LLAMA = SandboxModel(
    name="llama",
    family="tiny Llama (2 layers, full attention)",
    asset="tiny-llama",
    real_forward=True,
    stand_ins=(),
)

# The mamba families' CPU flags: extra_buffer needs GPU platform support, and
# no_buffer does not support the overlap schedule; a small state pool.
MAMBA_ARGS: tuple[str, ...] = (
    "--mamba-radix-cache-strategy", MAMBA_NO_BUFFER,
    "--disable-overlap-schedule",
    "--max-mamba-cache-size", str(MAMBA_CACHE_SLOTS),
)

HYBRID_MAMBA = SandboxModel(
    name="hybrid-mamba",
    family="tiny Kimi-Linear (KDA linear attention + MLA full attention, dense MLP)",
    asset="tiny-kimi-linear",
    real_forward=True,
    stand_ins=(DEVICE.name, LINEAR_ATTN_KERNELS.name, MLA_ABSORBED.name),
    launch_args=MAMBA_ARGS,
    # The state pool a limit of its own: 24 slots cap running requests at 8.
    overload_args=(*HYBRID_PRESSURE_ARGS, "--max-mamba-cache-size", "24"),
    hybrid="mamba",
)

# The other mamba family: the same CPU flags and overload as hybrid-mamba.
HYBRID_GDN = replace(
    HYBRID_MAMBA,
    name="hybrid-gdn",
    family="tiny Qwen3-Next (GDN linear attention + full attention, 4-expert MoE)",
    asset="tiny-qwen3-next",
    stand_ins=(DEVICE.name, LINEAR_ATTN_KERNELS.name),
)

HYBRID_SWA = SandboxModel(
    name="hybrid-swa",
    family="tiny gpt-oss (sliding-window + full attention with sinks, 4-expert MoE)",
    asset="tiny-gpt-oss",
    real_forward=False,  # torch_native has no attention sinks
    stand_ins=(FORWARD.name,),
    # gpt-oss refuses torch_native by name; intel_amx falls back to it without AMX.
    launch_args=("--attention-backend", "intel_amx"),
    overload_args=(*HYBRID_PRESSURE_ARGS, "--max-running-requests", "8"),
    hybrid="swa",
)

# sglang's dynamic-chunking profiler prefills ids below 10,000 (make_tiny_model.WIDE_VOCAB_SIZE).
LLAMA_WIDE_VOCAB = replace(
    LLAMA,
    name="llama-wide-vocab",
    family="tiny Llama with a 10,240-id embedding, for --enable-dynamic-chunking's profiler",
    asset="tiny-llama-wide-vocab",
)

MODELS: dict[str, SandboxModel] = {
    m.name: m for m in (LLAMA, HYBRID_MAMBA, HYBRID_GDN, HYBRID_SWA, LLAMA_WIDE_VOCAB)
}
DEFAULT_MODEL = LLAMA.name


def model(name: str) -> SandboxModel:
    """The registry entry called ``name``; ``UsageError`` naming the known ones otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise UsageError(f"unknown sandbox model {name!r}; known: {', '.join(MODELS)}") from None
