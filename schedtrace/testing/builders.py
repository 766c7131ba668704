"""Keyword-only builders for trace records, for tests, benches and sample tools.

Every field has a plain default (a small fcfs server on the tiny Llama), so a
caller names only what its case is about:

    header(max_req_slots=13, server_args=server_args(schedule_policy="lpm"))
    pass_record(3, waiting=[...], kv=KvSnapshot(available=900, evictable=0))
"""

from __future__ import annotations

from typing import Any

import msgspec

from schedtrace.tracer.contract.names import PINNED_SGLANG
from schedtrace.tracer.contract.schema import SCHEMA_VERSION, Header, KvSnapshot, Pass, ServerArgs

_SERVER_ARGS = ServerArgs(
    schedule_policy="fcfs",
    chunked_prefill_size=8192,
    max_prefill_tokens=16384,
    page_size=1,
    max_running_requests=12,
    max_total_tokens=40000,
    attention_backend="torch_native",
    model_path="tiny-llama",
)

_HEADER = Header(
    schema_version=SCHEMA_VERSION,
    sglang_version=PINNED_SGLANG,
    schedtrace_version="0.1.0",
    host="test-host",
    pid=1,
    tp_rank=0,
    dp_rank=None,
    start_wall_ns=0,
    server_args=_SERVER_ARGS,
    max_req_slots=13,
)

_PASS = Pass(
    seq=0, t_ns=0, dur_ns=100_000, repeat=1, idle_before=0,
    waiting=[], running=[], chunked=None, batch_is_full_in=False,
    kv=KvSnapshot(available=0, evictable=0), req_slots_free=1, new_token_ratio=0.4,
    chunked_prefill_size=8192, candidates=[], admitted=[], chunk=None,
    new_chunked_rid=None, batch_is_full_out=False,
)


def server_args(**fields: Any) -> ServerArgs:
    return msgspec.structs.replace(_SERVER_ARGS, **fields)


def header(**fields: Any) -> Header:
    return msgspec.structs.replace(_HEADER, **fields)


def pass_record(seq: int, **fields: Any) -> Pass:
    """A pass that admitted nothing; ``t_ns`` defaults to ``seq`` ms."""
    fields.setdefault("t_ns", seq * 1_000_000)
    return msgspec.structs.replace(_PASS, seq=seq, **fields)
