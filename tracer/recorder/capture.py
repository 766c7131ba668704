"""Pure functions: live sglang objects -> schema rows.

None of them mutate sglang state. Lengths and counts only, never token ids
or text. Two halves: the capture functions run on the scheduler thread on
every non-idle pass and read only what can change before the writer gets to
it (a few ints per request, the KV counts); the row builders run on the
writer thread and combine those ints with fields of the same ``Req`` objects
that never change once a request is queued (see the note below).
"""

from __future__ import annotations

import functools
import importlib.metadata
import socket
from typing import Any

from schedtrace.tracer.contract.versions import installed_version
from schedtrace.tracer.contract.schema import (
    SCHEMA_VERSION,
    ChunkedReq,
    Header,
    RunningReq,
    ServerArgs,
    WaitingReq,
)


# --- scheduler thread: capture what can change, by reference otherwise ----------
#
# Which ``Req`` fields are safe to read later (sglang 0.5.23): ``rid``,
# ``len(origin_input_ids)``, ``sampling_params.max_new_tokens``,
# ``sampling_params.ignore_eos`` and ``priority`` are all set before
# ``Scheduler._add_request_to_queue`` appends the request (tokenizer-side
# normalisation, ``init_req_max_new_tokens``, multimodal padding,
# ``set_finish_with_abort`` and ``_set_or_validate_priority`` all run in
# ``handle_generate_request`` / the grammar queue, before queueing) and are
# never written again while it is queued, running or chunked. Volatile, and so
# captured as ints at pass entry: ``prefix_len`` (``init_next_round_input``,
# ``reset_for_retract``) and ``len(output_ids)`` (every decode step, retract).

# Comprehensions, not ``map(attrgetter(...))``: on these many-attribute
# objects the interpreter's specialised attribute reads are about 1.5x faster.


def prefix_lens(reqs: list) -> list[int]:
    return [req.prefix_len for req in reqs]


def output_lens(reqs: list) -> list[int]:
    return [len(req.output_ids) for req in reqs]


# --- writer thread: rows from references + the ints captured at pass entry ---


def waiting_rows(reqs: list, prefix: list[int], outputs: list[int]) -> list[WaitingReq]:
    rows = []
    append = rows.append
    for req, prefix_len, output_len in zip(reqs, prefix, outputs):
        params = req.sampling_params
        append(WaitingReq(
            req.rid, len(req.origin_input_ids), output_len, params.max_new_tokens,
            prefix_len, req.priority, bool(params.ignore_eos),
        ))
    return rows


def running_rows(reqs: list, outputs: list[int]) -> list[RunningReq]:
    rows = []
    append = rows.append
    for req, output_len in zip(reqs, outputs):
        params = req.sampling_params
        append(RunningReq(
            req.rid, len(req.origin_input_ids), output_len, params.max_new_tokens, bool(params.ignore_eos),
        ))
    return rows


def chunked_row(req: Any, prefix_len: int, output_len: int) -> ChunkedReq:
    params = req.sampling_params
    return ChunkedReq(
        req.rid, len(req.origin_input_ids), prefix_len, params.max_new_tokens, output_len, bool(params.ignore_eos),
    )


def effective_chunk_size(scheduler: Any) -> int | None:
    """The chunked_prefill_size the pass will use (dynamic sizer included)."""
    size = scheduler.chunked_prefill_size
    chunked = scheduler.chunked_req
    sizer = getattr(scheduler, "dynamic_chunk_sizer", None)
    if chunked is not None and sizer is not None:
        predicted = sizer.predict(chunked.prefix_len)
        if predicted is not None:
            size = predicted
    return size


def finish_reason(req: Any) -> str:
    """The finish type as sglang reports it ("length", "stop", "abort", ...)."""
    reason = req.finished_reason
    if reason is None:
        return "unknown"
    try:
        kind = reason.to_json().get("type")
    except Exception:  # a reason class without to_json: fall back to its name
        kind = None
    return str(kind) if kind else type(reason).__name__


def server_args_row(args: Any) -> ServerArgs:
    return ServerArgs(
        schedule_policy=str(getattr(args, "schedule_policy", "")),
        chunked_prefill_size=getattr(args, "chunked_prefill_size", None),
        max_prefill_tokens=int(getattr(args, "max_prefill_tokens", 0) or 0),
        page_size=int(getattr(args, "page_size", 1) or 1),
        max_running_requests=getattr(args, "max_running_requests", None),
        max_total_tokens=getattr(args, "max_total_tokens", None),
        attention_backend=getattr(args, "attention_backend", None),
        model_path=str(getattr(args, "model_path", "")),
        enable_mixed_chunk=bool(getattr(args, "enable_mixed_chunk", False)),
        enable_priority_scheduling=bool(getattr(args, "enable_priority_scheduling", False)),
        disable_radix_cache=bool(getattr(args, "disable_radix_cache", False)),
        schedule_conservativeness=float(getattr(args, "schedule_conservativeness", 1.0)),
    )


def scheduler_ranks(scheduler: Any) -> tuple[int, int | None]:
    """(tp_rank, dp_rank) of the scheduler's process."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        return int(parallel.tp_rank), parallel.dp_rank
    except Exception:  # runtime context not published (unit use): fall back
        return int(getattr(scheduler, "tp_rank", 0) or 0), getattr(scheduler, "dp_rank", None)


def header_row(scheduler: Any, pid: int, start_wall_ns: int, part: int, first_pass: int) -> Header:
    tp_rank, dp_rank = scheduler_ranks(scheduler)
    req_pool = getattr(scheduler, "req_to_token_pool", None)
    return Header(
        schema_version=SCHEMA_VERSION,
        sglang_version=installed_version("sglang"),
        schedtrace_version=installed_version("schedtrace"),
        host=socket.gethostname(),
        pid=pid,
        tp_rank=tp_rank,
        dp_rank=dp_rank,
        start_wall_ns=start_wall_ns,
        server_args=server_args_row(scheduler.server_args),
        part=part,
        first_pass=first_pass,
        max_req_slots=int(getattr(req_pool, "size", 0) or 0),
        is_hybrid_swa=bool(getattr(scheduler, "is_hybrid_swa", False)),
        is_hybrid_mamba=getattr(req_pool, "mamba_allocator", None) is not None,
        mamba_chunk_grid=_mamba_chunk_grid(),
    )


def _mamba_chunk_grid() -> int:
    try:
        from sglang.srt.managers.schedule_policy import mamba_prefill_chunk_grid

        return int(mamba_prefill_chunk_grid())
    except Exception:  # older sglang without the grid: cuts are left alone
        return 1
