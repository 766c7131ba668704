"""A request's ``Arrival``: the ints read on the scheduler thread, the prefix ids hashed on the writer's.

Hashing an 8k-token prompt takes most of a millisecond, so the scheduler
thread only keeps a reference to the request's ``origin_input_ids`` (never
written once the request is queued, capture.py says why) and the writer
thread hashes it (``prefix_ids.prefix_ids``) when it builds the record.
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.prefix_ids import keyed_id, prefix_ids
from schedtrace.tracer.contract.schema import Arrival, Record
from schedtrace.tracer.recorder.writer_thread import Deferred


class ArrivalCapture(Deferred):
    __slots__ = ("t_ns", "req", "key", "block", "processed_tokens")

    def __init__(self, t_ns: int, req: Any, key: bytes, block: int, processed_tokens: int | None) -> None:
        self.t_ns = t_ns
        self.req = req
        self.key = key
        self.block = block
        self.processed_tokens = processed_tokens

    def build(self) -> Record:
        req, key = self.req, self.key
        params = req.sampling_params
        tokens = req.origin_input_ids
        namespace = f"{req.extra_key or ''}\0{req.cache_salt or ''}"
        routing = req.routing_key
        return Arrival(
            self.t_ns, req.rid, len(tokens), params.max_new_tokens, req.priority, bool(params.ignore_eos),
            prefix_ids(key, tokens, self.block, namespace) if self.block > 0 else b"",
            self.processed_tokens,
            keyed_id(key, str(routing)) if routing else None,
        )
