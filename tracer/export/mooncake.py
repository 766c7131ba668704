"""A recorded workload as a Mooncake trace (JSON lines), for sglang's ``bench_serving
--dataset-name mooncake``, aiperf, Dynamo and ``schedtrace redrive``'s peers.

One line per request, in arrival order:

* ``timestamp``: ms after the first arrival (an int, as Mooncake traces have it);
* ``input_length``, ``output_length`` (the tokens it produced, from its finish);
* ``hash_ids``: one small int per block of ``block_size`` input tokens
  (``MOONCAKE_BLOCK_TOKENS``, Mooncake's 512, or any multiple of the trace's
  ``Header.prefix_block``: the page size, or 16 on page size 1), numbered in
  first-seen order, so requests that shared a prefix share its ints
  (``schedtrace.tracer.analysis.workload``). The trace's ids are chained, so
  a coarse block's int is that of the trace's last block inside it;
* what a re-drive needs: ``max_new_tokens``, ``ignore_eos``, ``priority``
  (null: none), ``aborted`` (the client dropped it) with ``abort_ms`` (that
  long after its timestamp), ``finish_reason`` and ``block_size``.

Lengths and block numbers only: never a token id or text. Pure: rows in,
bytes out; the command writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import msgspec

from schedtrace.tracer.analysis.workload import Workload, WorkloadRequest
from schedtrace.tracer.contract.errors import UsageError

# Mooncake traces' block: bench_serving builds ~130 prompt tokens per hash id, so finer ids overflow small contexts.
MOONCAKE_BLOCK_TOKENS: Final = 512

_encoder = msgspec.json.Encoder()


def block_size_for(workload: Workload, asked: int | None) -> int:
    """The export's block: ``asked``, else Mooncake's where the trace's block divides it, else the trace's."""
    size = asked if asked is not None else (
        MOONCAKE_BLOCK_TOKENS if MOONCAKE_BLOCK_TOKENS % workload.block == 0 else workload.block)
    if size <= 0 or size % workload.block:
        raise UsageError(f"--block-size {size}: expected a multiple of the trace's {workload.block}-token block")
    return size


def coarse_ids(hash_ids: list[int], factor: int) -> list[int]:
    """One id per ``factor`` blocks: the chained id of the last block in each (the tail's, if partial)."""
    picked = hash_ids[factor - 1 :: factor]
    return picked + hash_ids[-1:] if len(hash_ids) % factor else picked


def mooncake_row(request: WorkloadRequest, block: int, hash_ids: list[int] | None = None) -> dict[str, Any]:
    return {
        "timestamp": round(request.t_ms),
        "input_length": request.input_len,
        "output_length": request.output_len,
        "hash_ids": request.hash_ids if hash_ids is None else hash_ids,
        "max_new_tokens": request.max_new_tokens,
        "ignore_eos": request.ignore_eos,
        "priority": request.priority,
        "aborted": request.client_aborted,
        "abort_ms": None if request.client_abort_ms is None else round(request.client_abort_ms),
        "finish_reason": request.finish_reason,
        "block_size": block,
    }


def mooncake_lines(workload: Workload, block: int | None = None) -> Iterator[bytes]:
    """Each request's JSON line, newline included, with hash ids per ``block`` tokens (``block_size_for``)."""
    block = block_size_for(workload, block)
    factor = block // workload.block
    numbers: dict[int, int] = {}  # the trace's block number -> this block's, in first-seen order
    for request in workload.requests:
        ids = [numbers.setdefault(i, len(numbers)) for i in coarse_ids(request.hash_ids, factor)]
        yield _encoder.encode(mooncake_row(request, block, ids)) + b"\n"
