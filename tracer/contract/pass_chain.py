"""A trace's passes by number: the pass index, and in v2 the keyframes and the deltas between them.

Index entry ``n`` is the pass whose ``seq`` is ``header.first_pass + n``
(the footer's index, checked, or one walk of the readable data). In v1
every pass record is whole. In v2 a pass between keyframes is a delta
(delta.py): ``pass_at(n)`` decodes the nearest keyframe at or before ``n``
and applies the deltas after it, or steps on from the pass it rebuilt last
(so reading passes in order applies each delta once).

A pass whose keyframe, or any pass between, lies in a gap cannot be rebuilt:
it is lost with the gap (``TraceDamagedError``) though its bytes are good,
up to the next keyframe, where reading resumes. ``Gap.orphans`` counts them.

A footer's index is the writer's: it holds while the file is whole. Read
past damage, a file with gaps is indexed by one walk instead (batches
swapped or copied in move the passes the footer points at), and a pass
record that does not rebuild or sits at the wrong place is a gap of its
own (``TraceReader._bad_record``).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from schedtrace.tracer.contract.codec import PASS_TAGS, peek_tag
from schedtrace.tracer.contract.delta import DeltaError, Walk, rebuild, rebuild_cost
from schedtrace.tracer.contract.errors import TraceDamagedError, TraceFormatError
from schedtrace.tracer.contract.framing import Gap
from schedtrace.tracer.contract.keyframes import cost_allowed
from schedtrace.tracer.contract.names import (BUILT_ROWS_PER_BYTE, COPIES_PER_BUILT_ROW, MAX_KEYFRAME_INTERVAL,
                                              MIN_ROW_BYTES, SEEK_BYTES)
from schedtrace.tracer.contract.pass_index import number_passes, room
from schedtrace.tracer.contract.schema import Pass, PassDelta, Record
from schedtrace.tracer.contract.verify import PEEK_BYTES, note_pass

if TYPE_CHECKING:
    from schedtrace.tracer.contract.reader import TraceReader

_gap_start = attrgetter("start")



class _Spent(NamedTuple):
    """What a chain has cost since its keyframe (at ``keyframe_at``): the bytes of its pass records, the keyframe's
    included (``decoded``, at most SEEK_BYTES), and the rows its deltas copy and build (``cost``, rebuild_cost)."""

    keyframe_at: int
    decoded: int
    cost: int = 0


class _Rebuilt(NamedTuple):
    """A pass rebuilt, with what its chain cost."""

    n: int
    pass_: Pass
    spent: _Spent


class PassChain:
    """The reader's passes by number (part of ``TraceReader``: it reads through the reader's internals)."""

    def __init__(self, reader: TraceReader, offsets: array | None, keyframes: array | None) -> None:
        self._reader = reader
        self._path = reader.path
        self._deltas = reader.header.schema_version >= 2
        self._offsets = offsets  # None: not indexed yet (a file without a usable footer)
        self._keyframes = keyframes  # v2: pass numbers written whole; None in v1 (every pass is)
        self._first_checked = False
        self._last: _Rebuilt | None = None  # the pass rebuilt last, to step on from
        self._lost: tuple[list[int], list[int], list[Gap]] | None = None
        self.max_rows = min(reader.max_record_bytes, SEEK_BYTES) // MIN_ROW_BYTES  # what one pass record could hold

    # --- the index ---

    @property
    def footer_offsets(self) -> array | None:
        """The index the footer gave, not yet checked against the passes (None: no footer)."""
        return self._offsets

    @property
    def offsets(self) -> array:
        footer = self._offsets
        if footer is None or (not self._first_checked and self._reader.skip_damaged
                              and self._reader._integrity().gaps):
            self._offsets, keyframes = self._scan()
            self._keyframes = keyframes if self._deltas else None
            self._first_checked = True
            if footer is not None:
                self._pad(len(footer))
        elif not self._first_checked:
            self._check_first_pass()
        return self._offsets

    def _pad(self, counted: int) -> None:
        """A damaged closed file keeps the footer's pass count: passes lost after the last one read are
        indexed at the start of the gap that holds them, as far as its bytes could hold them."""
        offsets, gaps = self._offsets, self._reader._integrity().gaps
        after = offsets[-1] + 1 if offsets else self._reader._data_start
        gap, fits = room(gaps, after, self._reader._integrity().data_end + 1)
        if gap is not None and counted > len(offsets):
            offsets.extend(array("Q", [gap.start]) * min(counted - len(offsets), fits))

    def forget_lost(self) -> None:
        """A gap was added: the passes each gap holds are counted again when next needed."""
        self._lost = None

    def number_of(self, offset: int) -> int:
        """The pass number of the pass record at ``offset``."""
        offsets = self.offsets
        n = bisect_left(offsets, offset)
        if n == len(offsets) or offsets[n] != offset:
            raise self._reader._bad_record(offset, "a pass record the pass index does not list")
        return n

    # --- passes by number ---

    def pass_at(self, n: int) -> Pass:
        offsets = self.offsets
        if not 0 <= n < len(offsets):
            raise IndexError(f"pass {n} out of range (trace has {len(offsets)})")
        keyframes = self._keyframes
        if keyframes is None:
            return self._numbered(n, self._whole(n))
        last = self._last
        if last is not None and last.n == n:
            return last.pass_
        at = bisect_right(keyframes, n) - 1
        if at < 0:
            gap = self._lost_between(0, n)  # the first keyframe was lost
            if gap is not None:
                raise TraceDamagedError(self._path, gap)
            raise self._reader._bad_record(offsets[n], f"pass {n} has no keyframe before it")
        k = keyframes[at]
        if n - k >= MAX_KEYFRAME_INTERVAL:
            raise self._reader._bad_record(offsets[n], f"pass {n} is {n - k} passes after its keyframe "
                                           f"(at most {MAX_KEYFRAME_INTERVAL - 1})")
        if last is None or not k <= last.n < n:
            p = self._whole(k)
            if type(p) is not Pass:
                raise self._reader._bad_record(offsets[k], f"keyframe {k} is not a whole pass record")
            last = _Rebuilt(k, self._numbered(k, p), _Spent(offsets[k], self._reader.decoded_bytes))
        gap = self._lost_between(last.n, n)
        if gap is not None:
            raise TraceDamagedError(self._path, gap)
        if n - last.n > 1:
            last = self._walked(last, n)
        elif n > last.n:
            last = self._after(last)
        self._last = last
        return last.pass_

    def _walked(self, last: _Rebuilt, n: int) -> _Rebuilt:
        """Pass ``n`` from the pass rebuilt last, building only pass ``n`` (delta.Walk)."""
        p, spent = last.pass_, last.spent
        walk = Walk(p, self.max_rows)
        reader = self._reader
        first = reader.header.first_pass
        for i in range(last.n + 1, n + 1):
            offset = self._offsets[i]
            record = reader._raw_record_at(offset)
            if type(record) is not PassDelta:  # a whole pass needs nothing before it
                p, spent = self._numbered(i, record), _Spent(offset, reader.decoded_bytes)
                walk = Walk(p, self.max_rows)
                continue
            if record.seq != first + i:
                raise self._reader._bad_record(offset, f"index entry {i} points at pass {record.seq}, "
                                               f"expected {first + i}")
            try:
                walk.apply(record)
            except DeltaError as exc:
                raise self._reader._bad_record(offset, f"bad delta pass {record.seq}: {exc}") from None
            spent = self._charged(spent, record, offset, reader.decoded_bytes)
        p = p if walk.delta is None else walk.rebuilt()  # seqs checked on the way: walk.seq is first + n
        return _Rebuilt(n, p, spent)

    def _whole(self, n: int) -> Record | None:
        return self._reader._raw_record_at(self._offsets[n])

    def _after(self, last: _Rebuilt) -> _Rebuilt:
        """The pass after the one rebuilt last."""
        n = last.n + 1
        offset = self._offsets[n]
        record = self._reader._raw_record_at(offset)
        if type(record) is not PassDelta:  # a whole pass needs nothing before it (anything else fails _numbered)
            return _Rebuilt(n, self._numbered(n, record), _Spent(offset, self._reader.decoded_bytes))
        p, spent = self.applied(last.pass_, record, offset, self._reader.decoded_bytes, last.spent)
        return _Rebuilt(n, self._numbered(n, p), spent)

    def _charged(self, spent: _Spent, delta: PassDelta, offset: int, size: int) -> _Spent:
        """What the chain has cost with ``delta`` (at ``offset``, ``size`` bytes), within the format's budgets.

        Charged once the delta applied, so that a delta that does not apply says why: one pass's rows at most
        are built past the budget, and a list copies no more rows than the pass before held (delta.plan)."""
        cost, decoded, keyframe_at = spent.cost + rebuild_cost(delta), spent.decoded + size, spent.keyframe_at
        span = offset - keyframe_at
        if decoded > SEEK_BYTES:
            raise self._reader._bad_record(offset, f"delta pass {delta.seq} makes a seek decode {decoded:,} bytes "
                                           f"of pass records from its keyframe, more than {SEEK_BYTES:,}")
        if cost > cost_allowed(span):
            raise self._reader._bad_record(offset, f"delta pass {delta.seq} has the reader build "
                                           f"{cost // COPIES_PER_BUILT_ROW} rows since its keyframe {span} bytes "
                                           f"before, more than {BUILT_ROWS_PER_BYTE} a byte")
        return _Spent(keyframe_at, decoded, cost)

    def applied(self, p: Pass, delta: PassDelta, offset: int, size: int, spent: _Spent) -> tuple[Pass, _Spent]:
        """The pass ``delta`` (at ``offset``, ``size`` bytes) makes of ``p``, and what the chain has cost with it."""
        if delta.seq != p.seq + 1:
            raise self._reader._bad_record(offset, f"delta pass {delta.seq} does not follow pass {p.seq}")
        try:
            rebuilt = rebuild(p, delta, self.max_rows)
        except DeltaError as exc:
            raise self._reader._bad_record(offset, f"bad delta pass {delta.seq}: {exc}") from None
        return rebuilt, self._charged(spent, delta, offset, size)

    def _numbered(self, n: int, record: Record | None) -> Pass:
        offset = self._offsets[n]
        if not isinstance(record, Pass):
            raise self._reader._bad_record(offset, f"index entry {n} does not point at a pass record")
        first = self._reader.header.first_pass
        if record.seq != first + n:
            raise self._reader._bad_record(offset, f"index entry {n} points at pass {record.seq}, "
                                           f"expected {first + n}")
        return record

    # --- streams (TraceReader.records) ---

    def resolve(self, stream: Iterator[tuple[int, Record]]) -> Iterator[tuple[int, Record]]:
        """``stream`` with every delta rebuilt; past a gap (``skip_damaged``) its orphans are left out."""
        if not self._deltas:
            yield from stream
            return
        base: Pass | None = None  # what the next delta applies to (None past a gap: wait for a keyframe)
        base_at = run = -1  # run: deltas since the keyframe
        spent = _Spent(-1, 0)
        started = False
        reader = self._reader
        for offset, record in stream:
            kind = type(record)
            if kind is PassDelta:
                size = reader.decoded_bytes  # taken first: _before decodes other records
                if not started:  # the stream starts after the pass this delta is against
                    started, base_at = True, offset
                    base, run, spent = self._before(offset)
                if base is not None and record.seq != base.seq + 1 and self._gap_after(base_at, offset):
                    base = None  # skipping damage: its chain crosses a gap
                if base is None:
                    continue
                run += 1
                try:
                    if run >= MAX_KEYFRAME_INTERVAL:
                        raise self._reader._bad_record(offset, f"delta pass {record.seq} is {run} passes after "
                                                       f"its keyframe (at most {MAX_KEYFRAME_INTERVAL - 1})")
                    record, spent = self.applied(base, record, offset, size, spent)
                    base = record
                except TraceDamagedError:  # reading on past damage: the passes after it wait for a keyframe
                    base = None
                    continue
                base_at = offset
            elif kind is Pass:
                started, base, base_at, run, spent = True, record, offset, 0, _Spent(offset, reader.decoded_bytes)
            yield offset, record


    def _before(self, offset: int) -> tuple[Pass | None, int, _Spent]:
        """The pass before the delta at ``offset``, how many deltas after its keyframe it is, and what its chain
        has cost."""
        try:
            n = self.number_of(offset)
            if n == 0:
                raise self._reader._bad_record(offset, "the first pass record is a delta (it has no keyframe)")
            p = self.pass_at(n - 1)
        except TraceDamagedError:
            if self._reader.skip_damaged:
                return None, 0, _Spent(-1, 0)
            raise
        keyframes, last = self._keyframes, self._last
        assert last is not None and last.n == n - 1
        return p, n - 1 - keyframes[bisect_right(keyframes, n - 1) - 1], last.spent

    # --- what gaps cost ---

    def _gap_after(self, start: int, end: int) -> bool:
        """Whether a gap starts between the two offsets (only when reading on past gaps)."""
        gaps = self._reader._integrity().gaps
        at = bisect_left(gaps, start, key=lambda gap: gap.start)
        return at < len(gaps) and gaps[at].start < end

    def _lost_between(self, first: int, last: int) -> Gap | None:
        """The gap holding a pass numbered ``first``..``last``, if one does."""
        if self._lost is None:
            self._lost = self._lost_ranges()
        starts, stops, gaps = self._lost
        at = bisect_left(stops, first)
        return gaps[at] if at < len(gaps) and starts[at] <= last else None

    def _lost_ranges(self) -> tuple[list[int], list[int], list[Gap]]:
        """Per gap that holds passes: the first pass number in it and the one after (ascending)."""
        gaps = self._reader._integrity().gaps
        held = gaps_holding(gaps, self._offsets)
        return [start for _, start, _ in held], [stop - 1 for _, _, stop in held], [gaps[i] for i, _, _ in held]

    def with_orphans(self, gaps: list[Gap]) -> list[Gap]:
        """v2: each gap that holds passes, with the passes after it that cannot be rebuilt (``orphans``)."""
        if not self._deltas or not gaps:
            return gaps
        offsets, keyframes, out = self.offsets, self._keyframes, list(gaps)
        held = gaps_holding(gaps, offsets)
        firsts = [start for _, start, _ in held]  # a later gap's passes are its own to count
        for later, (i, start, stop) in enumerate(held, 1):
            at = bisect_left(keyframes, stop)
            following = keyframes[at] if at < len(keyframes) else len(offsets)
            if later < len(firsts):
                following = min(following, firsts[later])
            out[i] = msgspec.structs.replace(gaps[i], orphans=max(following - stop, 0))
        return out

    # --- indexing a file without a footer ---

    def _scan(self) -> tuple[array, array]:
        """Index an unclosed file: one walk of the readable data, seqs checked as it goes."""
        reader = self._reader
        found = reader._integrity()
        offsets, seqs, whole = array("Q"), array("q"), array("Q")
        if reader.framed:
            data = reader._mm
            p_at = d_at = -1  # where b"pass" and b"delta" are next found (once passed): no other record is a pass
            for offset, frame_stop, count in reader._readable_frames(0):
                if p_at < offset:
                    p_at = data.find(b"pass", offset) % (len(data) + 1)  # none: -1, past the data
                if d_at < offset:
                    d_at = data.find(b"delta", offset) % (len(data) + 1)
                stop = min(frame_stop, offset + PEEK_BYTES)
                if count > 1 or (p_at >= stop and d_at >= stop):
                    continue
                head = data[offset : min(frame_stop, offset + PEEK_BYTES)]
                tag = peek_tag(head)
                if tag in PASS_TAGS:
                    if tag == "pass":
                        whole.append(len(offsets))
                    note_pass(offset, head, offsets, seqs)
        else:
            for _ in reader._regions(0):  # raises at a gap unless skip_damaged
                pass
            offsets, seqs = found.pass_offsets, found.pass_seqs
        return number_passes(reader.header.first_pass, reader._data_start, offsets, seqs, found.gaps,
                             reader._refuse, whole)

    def _check_first_pass(self) -> None:
        """The footer's index against the passes: the first readable one must have the header's first_pass."""
        self._first_checked = True
        reader = self._reader
        first = reader.header.first_pass
        for n, offset in enumerate(self._offsets):
            if reader._gap_holding(offset) is not None:
                continue
            try:
                record = reader._raw_record_at(offset)
            except TraceDamagedError:
                return  # reading on past damage: the record is a gap now
            at = offset  # where the error points: the record, or the header that disagrees with it
            if not isinstance(record, (Pass, PassDelta)):
                problem = f"footer index entry {n} does not point at a pass record"
            elif record.seq != first + n:
                problem = f"header first_pass is {first} but pass record {n} (offset {offset}) has seq {record.seq}"
                at = 0
            else:
                return
            if reader.skip_damaged:  # the pass is a gap of its own; the others are checked as they are read
                reader._refuse(offset, problem)
                return
            raise TraceFormatError(self._path, at, problem)


def gaps_holding(gaps: list[Gap], offsets: array) -> list[tuple[int, int, int]]:
    """(index into ``gaps``, its first pass, the pass after its last) of each gap that holds passes, in order;
    looked up from whichever are fewer, the gaps or the passes (a file can hold a gap every 4 bytes)."""
    if len(gaps) <= len(offsets):
        spans = ((i, bisect_left(offsets, gap.start), bisect_left(offsets, max(gap.end, gap.start + 1)))
                 for i, gap in enumerate(gaps))
        return [span for span in spans if span[2] > span[1]]
    starts = list(map(_gap_start, gaps))
    held: list[tuple[int, int, int]] = []
    for n, offset in enumerate(offsets):
        i = bisect_right(starts, offset) - 1
        if i >= 0 and offset < max(gaps[i].end, gaps[i].start + 1):
            if held and held[-1][0] == i:
                held[-1] = (i, held[-1][1], n + 1)
            else:
                held.append((i, n, n + 1))
    return held
