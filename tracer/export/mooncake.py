"""A recorded workload as a Mooncake trace (JSON lines), for sglang's ``bench_serving
--dataset-name mooncake``, aiperf, Dynamo and ``schedtrace redrive``'s peers.

One line per request, in arrival order:

* ``timestamp``: ms after the first arrival (an int, as Mooncake traces have it);
* ``input_length``, ``output_length`` (the tokens it produced, from its finish);
* ``hash_ids``: one small int per block of ``block_size`` input tokens
  (``Header.prefix_block``: the page size, or 16 on page size 1), numbered in
  first-seen order, so requests that shared a prefix share its ints
  (``schedtrace.tracer.analysis.workload``);
* what a re-drive needs: ``max_new_tokens``, ``ignore_eos``, ``priority``
  (null: none), ``aborted`` (the client dropped it) with ``abort_ms`` (that
  long after its timestamp), ``finish_reason`` and ``block_size``.

Lengths and block numbers only: never a token id or text. Pure: rows in,
bytes out; the command writes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from schedtrace.tracer.analysis.workload import Workload, WorkloadRequest

_encoder = msgspec.json.Encoder()


def mooncake_row(request: WorkloadRequest, block: int) -> dict[str, Any]:
    return {
        "timestamp": round(request.t_ms),
        "input_length": request.input_len,
        "output_length": request.output_len,
        "hash_ids": request.hash_ids,
        "max_new_tokens": request.max_new_tokens,
        "ignore_eos": request.ignore_eos,
        "priority": request.priority,
        "aborted": request.client_aborted,
        "abort_ms": None if request.client_abort_ms is None else round(request.client_abort_ms),
        "finish_reason": request.finish_reason,
        "block_size": block,
    }


def mooncake_lines(workload: Workload) -> Iterator[bytes]:
    """Each request's JSON line, newline included."""
    for request in workload.requests:
        yield _encoder.encode(mooncake_row(request, workload.block)) + b"\n"
