"""Writer thread: schema rows from live ``Req`` references plus the ints captured at pass entry.

Pure functions, lengths and counts only, never token ids or text. They read
only the ``Req`` fields that never change once a request is queued
(``schedtrace.tracer.recorder.capture`` says which, and why); the volatile
ones come in as the ints the pass captured.
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.schema import ChunkedReq, RunningReq, WaitingReq


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
