"""The holes in one rank's trace: what could not be read, and what the recorder counted as lost.

Two kinds, both counted in full and the first ``MAX_HOLES_LISTED`` of each listed:

* an unreadable region (``TraceReader.gaps``): its bytes, the records it held
  and the pass numbers lost with it (those inside it, and in v2 the delta
  passes after it up to the next keyframe);
* a ``loss`` record: records the recorder never wrote (queue full, a failed
  write, ring mode, paused), and the last pass before it. Those records were
  dropped just before the loss record was written, so it stands where they
  would have; the recorder numbers only the passes it writes, so a loss
  leaves no pass number missing.

``holes_of`` is pure over the gaps, the loss records and the pass index;
``scan_holes`` feeds it from a reader (one pass over the records); ``info``'s
summary feeds it from the pass it already makes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.report import MAX_HOLES_LISTED, DamagedRegion, Holes, LostRecords
from schedtrace.tracer.contract.schema import Loss
from schedtrace.tracer.contract.traceset import RankTrace

Reader = TraceReader | RankTrace
LOSS_TAG = Loss.__struct_config__.tag


def damaged_region(gap: Gap, pass_offsets: Sequence[int], first_pass: int) -> DamagedRegion:
    """``gap`` with the pass numbers it cost: the passes indexed inside it, then its orphans."""
    # A lost pass is indexed at its own offset (a footer's index) or at the gap's start (a scan).
    first = bisect_left(pass_offsets, gap.start)
    stop = bisect_left(pass_offsets, max(gap.end, gap.start + 1))
    stop = min(stop + gap.orphans, len(pass_offsets))
    lost = stop - first
    return DamagedRegion(
        start=gap.start, end=gap.end, records_lost=gap.lost, reason=gap.reason, passes_lost=lost,
        first_pass=first_pass + first if lost else None, last_pass=first_pass + stop - 1 if lost else None,
    )


def lost_records(offset: int, loss: Loss, pass_offsets: Sequence[int], first_pass: int) -> LostRecords:
    """The loss record at ``offset``, placed after the last pass indexed before it."""
    before = bisect_right(pass_offsets, offset)
    return LostRecords(offset=offset, reason=loss.reason, count=loss.count,
                       after_pass=first_pass + before - 1 if before else None)


def holes_of(gaps: Iterable[Gap], losses: Iterable[tuple[int, Loss]], pass_offsets: Sequence[int],
             first_pass: int) -> Holes:
    """Every hole, counted; the first ``MAX_HOLES_LISTED`` regions and loss records listed, in file order."""
    holes = Holes(regions=[], losses=[])
    for gap in gaps:
        region = damaged_region(gap, pass_offsets, first_pass)
        holes.region_count += 1
        holes.passes_lost += region.passes_lost
        if region.records_lost is None:
            holes.unknown_regions += 1
        else:
            holes.records_lost += region.records_lost
        if len(holes.regions) < MAX_HOLES_LISTED:
            holes.regions.append(region)
    for offset, loss in losses:
        holes.loss_count += 1
        holes.records_lost += loss.count
        if len(holes.losses) < MAX_HOLES_LISTED:
            holes.losses.append(lost_records(offset, loss, pass_offsets, first_pass))
    return holes


def scan_holes(reader: Reader) -> Holes:
    """The holes of the trace ``reader`` reads: its gaps and its loss records.

    A file closed cleanly whose footer counts no ``loss`` record holds none (the footer counts every
    record by tag): it is not read again, which cost a replay about a tenth of its time.
    """
    if isinstance(reader, TraceReader) and reader.closed_cleanly and not reader.footer.counts.get(LOSS_TAG):
        return holes_of([], [], reader.pass_offsets, reader.header.first_pass)
    losses = [(offset, record) for offset, record in reader.records() if type(record) is Loss]
    return holes_of(reader.gaps, losses, reader.pass_offsets, reader.header.first_pass)


def _counted(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def holes_text(holes: Holes) -> str:
    """``60 records lost in 1 unreadable region (36 pass numbers missing) and 2 loss records``."""
    parts = []
    if holes.region_count:
        parts.append(f"{_counted(holes.region_count, 'unreadable region')} "
                     f"({_counted(holes.passes_lost, 'pass number')} missing)")
    if holes.loss_count:
        parts.append(_counted(holes.loss_count, "loss record"))
    records = f"{holes.records_lost:,}{' or more' if holes.unknown_regions else ''}"
    return f"{records} records lost in {' and '.join(parts)}"


def holes_warning(holes: Holes, passes_present: int) -> str | None:
    """One line for a report's warnings: what is missing, and that results are over what is present."""
    if not holes.count:
        return None
    return f"{holes_text(holes)}; results are over the {passes_present:,} passes present"
