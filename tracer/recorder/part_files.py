"""The trace on disk of one writer: its parts, their pass numbering, and what reached them.

Writer thread only. ``write`` numbers the records (``Pass.seq`` consecutive
over the passes that reached the file, events' ``pass_seq`` after them) and
hands them to the part's ``TraceWriter``, whose contract is that a failed
write leaves the file at its last whole batch and says how many of the
records landed (``TraceWriteError``). So every count here is a count of what
is on disk: the footer's tags, ``idle_passes`` and ``lost`` cover exactly
the records in that part, and the records that did not land are counted in
``write_errors`` (every later footer) and written as one
``Loss(reason="write_error")`` with the next write that succeeds.

The first failure of any kind is logged, one line; later ones are only
counted. A part that cannot be opened (the directory went away, the disk is
full) is retried at the next write; its records are lost meanwhile, counted.

Parts: a part is closed once it reaches ``part_limit`` and the next is opened
at the next write, named by ``naming.claim_part`` (``O_EXCL``, never an
existing file). Each starts with its ``Header``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from schedtrace.tracer.contract.errors import TraceWriteError
from schedtrace.tracer.contract.format import TraceWriter
from schedtrace.tracer.contract.names import LOSS_WRITE_ERROR
from schedtrace.tracer.contract.schema import Aiter, Alloc, Header, Idle, Loss, Pass, Record
from schedtrace.tracer.recorder.budget import DiskBudget
from schedtrace.tracer.recorder.naming import claim_part
from schedtrace.tracer.recorder.policy import WriterPolicy

logger = logging.getLogger(__name__)

HeaderFactory = Callable[[int, int], Header]  # (part, first_pass) -> Header


class PartFiles:
    def __init__(self, directory: Path, stem: str, make_header: HeaderFactory, clock_ns: Callable[[], int], *,
                 max_bytes: int, policy: WriterPolicy, footer_counts: Callable[[], dict[str, int]]) -> None:
        self.directory = directory
        self.stem = stem
        self.paths: list[Path] = []  # every part created, in order (the budget may have deleted the first ones)
        self.part = 0  # the part open now, or the next one to open
        self.next_pass_seq = 0
        self.write_errors = 0  # records that did not reach a file
        self.bytes_written = 0  # over every part (ring mode measures its after-trigger window with it)
        self.failures = 0  # failed opens, writes and closes (the first is logged)
        self.unsent: list[Record] = []  # a new part's header: the sinks get it with the part's first records
        self.budget = DiskBudget(policy.max_total_bytes) if policy.max_total_bytes else None
        self.part_limit = self.budget.part_limit(max_bytes) if self.budget else max_bytes
        self._policy = policy
        self._make_header = make_header
        self._clock_ns = clock_ns
        self._footer_counts = footer_counts
        self._writer: TraceWriter | None = None
        self._dup = 0  # naming: the first free duplicate number of the stem
        self._part_idle = 0  # idle passes counted by Idle records in this part
        self._part_lost = 0  # records reported by Loss records in this part
        self._unreported = 0  # write_errors not yet in a Loss record

    @property
    def path(self) -> Path | None:
        return self._writer.path if self._writer is not None else None

    def open(self, *, strict: bool = False) -> bool:
        """Open the next part; False (counted, logged once) if that fails, or raise if ``strict``."""
        try:
            self._open()
        except Exception as exc:
            if strict:
                raise
            self._failed(f"cannot open part {self.part} in {self.directory}", exc)
            return False
        return True

    def _open(self) -> None:
        header = self._make_header(self.part, self.next_pass_seq)
        self._dup, path = claim_part(self.directory, self.stem, self.part, self._dup)
        try:
            writer = TraceWriter(path, header, fsync_every_s=self._policy.fsync_every_s, ops=self._policy.file_ops)
        except BaseException:
            _discard(path)  # it holds no whole record: leave no empty or torn file behind
            raise
        self.paths.append(path)
        self._writer = writer
        self._part_idle = self._part_lost = 0
        self.unsent = [header]

    def write(self, records: list[Record]) -> list[Record]:
        """Number ``records`` and write them to the current part; returns the ones that landed."""
        if self._writer is None and not self.open():
            self._lost(len(records))
            return []
        size_before = self._writer.size
        if self._unreported:
            self._report_losses()
        start = self.next_pass_seq
        self._number(records, start)
        try:
            self._writer.write_many(records)
            landed = len(records)
        except TraceWriteError as exc:
            self._failed("cannot write the trace", exc)
            landed = exc.records_written
        except Exception as exc:  # encoding failed before anything was written
            self._failed("cannot encode a trace batch", exc)
            landed = 0
        if landed < len(records):
            self._lost(len(records) - landed)
            records = records[:landed]
        left_out = self._writer.left_out  # passes too large to write, with their events: a Loss holds them
        if left_out and landed:
            self._part_lost += len(left_out)
            out = set(map(id, left_out))
            records = [record for record in records if id(record) not in out]
        self.next_pass_seq = self._writer.first_pass + self._writer.passes  # after the last pass that landed
        self._tally(records)
        self.bytes_written += self._writer.size - size_before
        self._after_write()
        return records

    def _number(self, records: list[Record], seq: int) -> None:
        """Assign pass numbers from ``seq`` (``write`` then takes ``next_pass_seq`` from what the file holds)."""
        for record in records:
            kind = type(record)
            if kind is Pass:
                record.seq = seq
                seq += 1
            elif kind is Alloc or kind is Aiter:
                record.pass_seq = seq - 1

    def _tally(self, records: list[Record]) -> None:
        for record in records:
            kind = type(record)
            if kind is Idle:
                self._part_idle += record.count
            elif kind is Loss:
                self._part_lost += record.count

    def _lost(self, count: int) -> None:
        self.write_errors += count
        self._unreported += count

    def _report_losses(self) -> None:
        """The records earlier writes lost, as one ``Loss`` before the next records."""
        loss = Loss(self._clock_ns(), self._unreported, LOSS_WRITE_ERROR)
        try:
            self._writer.write(loss)
        except Exception as exc:
            self._failed("cannot write the trace", exc)
            return
        self._unreported = 0
        self._part_lost += loss.count

    def _after_write(self) -> None:
        writer = self._writer
        if writer is not None and writer.size >= self.part_limit:
            self.close_part()
        elif self.budget is not None:
            self.budget.enforce(writer.size if writer is not None else 0)

    def close_part(self) -> None:
        """Footer, tail, sync and close the current part, if one is open."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        counts = self._footer_counts()
        counts.update({"idle_passes": self._part_idle, "lost": self._part_lost})
        if self.write_errors:
            counts["write_errors"] = self.write_errors
        if writer.sync_errors:
            counts["sync_errors"] = writer.sync_errors
        if self.budget is not None:
            counts.update(self.budget.counts())
        try:
            writer.close(self._clock_ns(), counts)
        except Exception as exc:
            self._failed(f"cannot close {writer.path} (it reads as not closed)", exc)
            writer.abandon()
        self.part += 1
        if self.budget is not None:
            self.budget.closed(writer.path, writer.size)
            self.budget.enforce(0)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            logger.warning("schedtrace: %s: %s; recording goes on, and what is lost is counted "
                           "(write_errors in the footer, loss records), not logged again", what, exc)


def _discard(path: Path) -> None:
    """Remove a part this writer created but could not start (it holds no whole record)."""
    try:
        os.unlink(path)
    except OSError:
        pass
