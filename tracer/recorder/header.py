"""The ``Header`` of each trace part, read from the scheduler it records.

Built by the writer when it opens a part (the first, and each rotation), so
after the scheduler's ``__init__``: what the scheduler resolved is read from
the scheduler itself (its ``chunked_prefill_size`` after sglang's defaults and
the DP-attention split; ``enable_overlap``), not from the server args given.
"""

from __future__ import annotations

import socket
from typing import Any

from schedtrace.tracer.contract.prefix_ids import block_tokens
from schedtrace.tracer.contract.schema import SCHEMA_VERSION, ChunkSizerFit, Header, ServerArgs
from schedtrace.tracer.contract.versions import installed_version
from schedtrace.tracer.recorder import pools
from schedtrace.tracer.recorder.ranks import read_ranks
from schedtrace.tracer.recorder.settings import read_settings


def server_args_row(args: Any, scheduler: Any = None) -> ServerArgs:
    return ServerArgs(
        schedule_policy=str(getattr(args, "schedule_policy", "")),
        chunked_prefill_size=_chunked_prefill_size(args, scheduler),
        max_prefill_tokens=int(getattr(args, "max_prefill_tokens", 0) or 0),
        page_size=int(getattr(args, "page_size", 1) or 1),
        max_running_requests=_derived(scheduler, "max_running_requests", args, "max_running_requests"),
        max_total_tokens=_derived(scheduler, "max_total_num_tokens", args, "max_total_tokens"),
        attention_backend=getattr(args, "attention_backend", None),
        model_path=str(getattr(args, "model_path", "")),
        enable_mixed_chunk=bool(getattr(args, "enable_mixed_chunk", False)),
        enable_priority_scheduling=bool(getattr(args, "enable_priority_scheduling", False)),
        disable_radix_cache=bool(getattr(args, "disable_radix_cache", False)),
        schedule_conservativeness=float(getattr(args, "schedule_conservativeness", 1.0)),
    )


def header_row(scheduler: Any, pid: int, start_wall_ns: int, part: int, first_pass: int, run_id: str = "") -> Header:
    ranks = read_ranks(scheduler)  # ranks and widths (ranks.py)
    req_pool = getattr(scheduler, "req_to_token_pool", None)
    return Header(
        schema_version=SCHEMA_VERSION,
        sglang_version=installed_version("sglang"),
        schedtrace_version=installed_version("schedtrace"),
        host=socket.gethostname(),
        pid=pid,
        run_id=run_id,
        **ranks,
        start_wall_ns=start_wall_ns,
        server_args=server_args_row(scheduler.server_args, scheduler),
        part=part,
        first_pass=first_pass,
        max_req_slots=int(getattr(req_pool, "size", 0) or 0),
        is_hybrid_swa=bool(getattr(scheduler, "is_hybrid_swa", False)),
        is_hybrid_mamba=getattr(req_pool, "mamba_allocator", None) is not None,
        mamba_chunk_grid=_mamba_chunk_grid(),
        pools=pools.pool_layout(scheduler),
        exact_chunk_fill=pools.exact_chunk_fill(),
        overlap_schedule=_overlap_loop(scheduler, ranks["pp_size"] or 1),
        prefix_block=block_tokens(int(getattr(scheduler, "page_size", 1) or 1)),
        settings=read_settings(scheduler.server_args),
        chunk_sizer=chunk_sizer_fit(scheduler),
    )


def chunk_sizer_fit(scheduler: Any) -> ChunkSizerFit | None:
    """The dynamic chunk sizer's fitted model, if the scheduler has a ready one."""
    sizer = getattr(scheduler, "dynamic_chunk_sizer", None)
    predictor = getattr(sizer, "predictor", None)
    if predictor is None or not predictor.is_ready or predictor.target_latency is None:
        return None
    return ChunkSizerFit(
        quadratic=float(predictor.quadratic_coeff_a),
        linear=float(predictor.linear_coeff_b),
        constant=float(predictor.constant_coeff_c),
        target_latency_ms=float(predictor.target_latency),
        context_len=int(sizer.model_config.context_len),
    )


def _derived(scheduler: Any, name: str, args: Any, flag: str) -> int | None:
    """The scheduler's own value of a capacity (sglang fills in an unset flag and caps a given
    one: the mamba state cache caps the running requests); the flag as given without one."""
    value = getattr(scheduler, name, None) if scheduler is not None else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return getattr(args, flag, None)


def _chunked_prefill_size(args: Any, scheduler: Any) -> int | None:
    """The chunk size the scheduler uses: None when it does not chunk (sglang's None or <= 0)."""
    if scheduler is not None and hasattr(scheduler, "chunked_prefill_size"):  # set by init_chunked_prefill
        return scheduler.chunked_prefill_size
    return getattr(args, "chunked_prefill_size", None)


def _overlap_loop(scheduler: Any, pp_size: int) -> bool | None:
    """Whether the scheduler runs sglang's overlap loop, as its event-loop dispatch chooses
    (``_dispatch_event_loop_once``): ``enable_overlap``, one pipeline stage, no PD multiplexing.
    None: a scheduler without ``enable_overlap`` (another sglang): unknown."""
    enabled = getattr(scheduler, "enable_overlap", None)
    if not isinstance(enabled, bool):
        return None
    return enabled and pp_size <= 1 and not getattr(scheduler, "enable_pdmux", False)


def _mamba_chunk_grid() -> int:
    try:
        from sglang.srt.managers.schedule_policy import mamba_prefill_chunk_grid

        return int(mamba_prefill_chunk_grid())
    except Exception:  # older sglang without the grid: cuts are left alone
        return 1
