"""Read and write trace files: the one import for both sides.

A trace is a plain msgpack stream of schema records: ``Header``, then
passes and events in time order, then (on clean close only) ``Footer`` and
a fixed-size tail ``["tail", <footer offset>]``. Framed traces (the
default) put a checksummed ``batch`` marker before each write's records
(framing.py); unframed traces have none and still read as before. In
format v2 (the default) a pass between keyframes is stored as a delta; the
reader hands out whole passes either way.

Where each part lives: ``codec`` (records to bytes), ``framing`` (markers,
checksums, gaps), ``writer`` (``TraceWriter``: batches, durability, disk
full), ``reader`` (``TraceReader``), ``opening`` (the header and whether the
file is framed), ``verify`` (finding gaps), ``footer`` (checking the footer
and its indexes), ``frames`` (stepping over msgpack), ``delta`` (a pass as
what changed, and back), ``keyframes`` (when a pass is written whole),
``pass_chain`` (passes by number: the index, keyframes, rebuilding),
``convert`` (rewriting a trace in another version).
"""

from __future__ import annotations

from schedtrace.tracer.contract.codec import MAX_RECORD_BYTES, encode, encode_into
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.keyframes import KeyframePolicy
from schedtrace.tracer.contract.reader import TraceReader
from schedtrace.tracer.contract.writer import DEFAULT_FSYNC_EVERY_S, FileOps, TraceWriter, write_trace

__all__ = [
    "DEFAULT_FSYNC_EVERY_S",
    "MAX_RECORD_BYTES",
    "FileOps",
    "Gap",
    "KeyframePolicy",
    "TraceReader",
    "TraceWriter",
    "encode",
    "encode_into",
    "write_trace",
]
