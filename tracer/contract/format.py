"""Read and write trace files: the one import for both sides.

A trace is a plain msgpack stream of schema records: ``Header``, then
passes and events in time order, then (on clean close only) ``Footer`` and
a fixed-size tail ``["tail", <footer offset>]``. Framed traces (the
default) put a checksummed ``batch`` marker before each write's records
(framing.py); v1 traces have none and still read as before.

Where each part lives: ``codec`` (records to bytes), ``framing`` (markers,
checksums, gaps), ``writer`` (``TraceWriter``: batches, durability, disk
full), ``reader`` (``TraceReader``), ``verify`` (finding gaps), ``footer``
(checking the footer and its index), ``frames`` (stepping over msgpack).
"""

from __future__ import annotations

from schedtrace.tracer.contract.codec import MAX_RECORD_BYTES, encode, encode_into
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.reader import TraceReader
from schedtrace.tracer.contract.writer import DEFAULT_FSYNC_EVERY_S, FileOps, TraceWriter, write_trace

__all__ = [
    "DEFAULT_FSYNC_EVERY_S",
    "MAX_RECORD_BYTES",
    "FileOps",
    "Gap",
    "TraceReader",
    "TraceWriter",
    "encode",
    "encode_into",
    "write_trace",
]
