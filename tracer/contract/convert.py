"""Rewrite a trace in another format version (``schedtrace convert``): v1 to v2, or back.

Every record is read whole (v2 deltas rebuilt) and written again by
``TraceWriter``, so the output holds the same records, field for field, in
the same order, with its own framing, keyframes and footer. The footer's
counts that are not record tags (``idle_passes``, ``lost``, the recorder's
error counts) are carried over; a source that was not closed gets them
summed from its ``idle`` and ``loss`` records. A damaged source is refused
(``TraceDamagedError``): a converted file must not read as whole when its
source was not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import msgspec

from schedtrace.tracer.contract.reader import TraceReader
from schedtrace.tracer.contract.schema import RECORD_TYPES, SCHEMA_VERSION, Idle, Loss, Pass
from schedtrace.tracer.contract.writer import TraceWriter

BATCH_RECORDS: Final = 4096  # records per write: the writer cuts them into checksummed batches of SPLIT_BYTES
# Rows (a pass's waiting and running rows count one each) a write holds at most: rebuilt v2 passes are whole
# lists each, so a write of many long passes would hold far more than the source's bytes.
BATCH_ROWS: Final = 1 << 16


class Converted(msgspec.Struct, frozen=True):
    source_bytes: int
    source_version: int
    dest_bytes: int
    version: int
    passes: int
    keyframes: int  # passes written whole (v1: all of them)


def convert_trace(source: str | os.PathLike, dest: str | os.PathLike, *, version: int = SCHEMA_VERSION) -> Converted:
    with TraceReader(source) as reader:
        records = reader.records()
        header = next(records)[1]
        writer = TraceWriter(dest, header, version=version, fsync_every_s=None)
        t_ns = idle = lost = 0
        batch: list = []
        rows = 0
        try:
            for _, record in records:
                t_ns = max(t_ns, getattr(record, "t_ns", 0))
                kind = type(record)
                if kind is Idle:
                    idle += record.count
                elif kind is Loss:
                    lost += record.count
                elif kind is Pass:
                    rows += len(record.waiting) + len(record.running)
                batch.append(record)
                if len(batch) >= BATCH_RECORDS or rows >= BATCH_ROWS:
                    writer.write_many(batch)
                    batch.clear()
                    rows = 0
            writer.write_many(batch)
            extra = {"idle_passes": idle, "lost": lost}
            if reader.footer is not None:
                t_ns = reader.footer.t_ns
                extra = {tag: n for tag, n in reader.footer.counts.items() if tag not in RECORD_TYPES}
            writer.close(t_ns, extra)
        except BaseException:
            writer.abandon()
            Path(dest).unlink(missing_ok=True)
            raise
        passes = writer.passes
        keyframes = len(writer.keyframes) if version > 1 else passes
        return Converted(source_bytes=reader.file_size, source_version=header.schema_version,
                         dest_bytes=writer.size, version=version, passes=passes, keyframes=keyframes)
