"""Writer thread: schema rows from live ``Req`` references plus the ints captured at pass entry,
and the ``Alloc`` records from the ints an allocator hook read.

Pure functions, lengths and counts only, never token ids or text. They read
only the ``Req`` fields that never change once a request is queued
(``schedtrace.tracer.recorder.capture`` says which, and why); the volatile
ones come in as the ints the pass captured.
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.schema import Alloc, ChunkedReq, RunningReq, WaitingReq


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


MAMBA_ALLOC = "mamba_alloc"  # ``Alloc.op`` of the mamba state slots (MambaSlotAllocator.alloc)


def alloc_row(t_ns: int, op: str, requested: int, available: int, evictable: int, ok: bool) -> Alloc:
    """``Recorder.on_alloc``'s deferred call; ``pass_seq`` is numbered at write."""
    return Alloc(t_ns, -1, op, int(requested), int(available), int(evictable), ok)


def mamba_alloc_row(t_ns: int, requested: int, free_slots: Any, evictable: int, ok: bool) -> Alloc:
    """``alloc_row`` of state slots (``capture.SlotTally``), with ``MambaSlotAllocator.available_size()``
    taken here: ``len`` of the free list the first call started from. sglang never resizes a
    free list in place (an allocation rebinds ``free_slots`` to a slice, a free to a
    ``torch.cat``, ``clear`` to a new ``arange``), so its length now is the count then."""
    return alloc_row(t_ns, MAMBA_ALLOC, requested, len(free_slots), evictable, ok)
