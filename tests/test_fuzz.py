"""Fuzzing the reader's contract (issue 12): seeded, deterministic, bounded to about 20 s.

Bases: the two v1 sample traces (traces/kv-pressure-*.trace); the first
one's records written framed in writer-thread-sized batches as v1 (every
pass whole) and as v2 (keyframes and deltas, the writer's default), closed
and not closed; a synthetic v2 trace written in large batches; a v1 trace
that was not closed. Each case applies one mutation to a copy: a
truncation, flipped bits, an overwritten span, damage near the footer, tail
or index, or hostile msgpack written over a record or spliced in before one.

The contract, per case:

* only ``TraceFormatError`` escapes (and ``TraceVersionError`` when a v1
  header, which has no checksum, was hit), and every error names an offset
  inside the file;
* a record read at an original offset whose original bytes were not touched
  is the original record; in a framed trace every record read before
  ``unchecked_from`` is the original record at that offset, touched or not;
* framed, read past gaps: every original record is read, or lies in a
  reported gap, or past where the file ends (``truncated_at``) or where an
  error stopped, or (v2) is a delta pass whose chain back to its keyframe
  holds a pass that is lost; a gap's lost count is exactly the records it
  held, and its ``orphans`` exactly the delta passes so lost after it;
* a rebuilt pass counts as touched when any byte from its keyframe to its
  own end was (in a framed trace that matters only past ``unchecked_from``);
* ``closed_cleanly`` means every original record was read back;
* memory stays bounded (tracemalloc peak, on the hostile cases and a sample).

A failure prints the base, the case number and the mutation: rerun it with
``FUZZ_ONLY=base:case`` (and the same ``FUZZ_SEED``). Files crafted with
valid checksums, batches swapped or copied in, and records that fail the
schema are tests/test_hostile.py's (issue 23).
"""

from __future__ import annotations

import os
import random
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

from schedtrace.tracer.contract.codec import peek_tag
from schedtrace.tracer.contract.errors import TraceDamagedError, TraceFormatError, TraceVersionError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter
from schedtrace.tracer.contract.frames import frames
from schedtrace.tracer.contract.schema import Pass
from schedtrace.testing.synthetic import generate

ROOT = Path(__file__).resolve().parent.parent
FCFS = ROOT / "tests" / "traces" / "v1-kv-pressure-fcfs.trace"  # v1 recordings: the fuzz sources
LPM = ROOT / "traces" / "kv-pressure-lpm-24k.trace"
CASES_PER_BASE = int(os.environ.get("FUZZ_CASES", "40"))  # more for a longer hunt: FUZZ_CASES=2000
SEED = os.environ.get("FUZZ_SEED", "")  # another seed, another set of cases
MAX_RECORD = 4 << 20  # the reader's record limit in these cases
PEAK_LIMIT = 24 << 20  # tracemalloc peak allowed for one case (the files are 0.3-2.4 MB)
HOSTILE = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 4 billion
    b"\xdf\xff\xff\xff\xff",  # map32 of 4 billion pairs
    b"\xdb\x7f\xff\xff\xff",  # str32 of 2 GiB
    b"\xc6\xff\xff\xff\xf0",  # bin32 of 4 GiB
    b"\xc9\x7f\xff\xff\xff\x01",  # ext32 of 2 GiB
    b"\x91" * 4096,  # arrays nested past any stack
    b"\xc1" * 8,  # bytes msgpack never uses
    b"\x92\xa4pass\xcf" + b"\xff" * 8,  # a pass record of the wrong shape
    b"\x95\xa5batch\xcf" + b"\x00" * 8 + b"\xce\x00\x00\x00\x01\xce\x7f\xff\xff\xff\xcf" + b"\x00" * 8,  # a lying marker
    b"\x92\xa6footer\x00",  # a footer in the middle
]


@dataclass
class Base:
    name: str
    data: bytes
    framed: bool
    records: dict[int, tuple[int, object]]  # offset -> (end, record)
    passes: dict[int, object]  # seq -> pass
    keyframe_of: dict[int, int]  # offset of a pass record -> offset of its keyframe (itself when whole)
    pass_offset: dict[int, int]  # seq -> offset


def load_base(name: str, path: Path) -> Base:
    with TraceReader(path) as reader:
        records = {}
        for offset, record in reader.records():
            records[offset] = record
        ends = {start: end for start, end in frames(reader._mm, 0, reader.data_end, MAX_RECORD)}
        framed = reader.framed
        data = path.read_bytes()
    keyframe_of, keyframe = {}, 0
    for offset, record in records.items():
        if isinstance(record, Pass):
            if peek_tag(data[offset : offset + 16]) == "pass":
                keyframe = offset
            keyframe_of[offset] = keyframe
    return Base(name=name, data=data, framed=framed, records={o: (ends[o], r) for o, r in records.items()},
                passes={r.seq: r for r in records.values() if isinstance(r, Pass)}, keyframe_of=keyframe_of,
                pass_offset={r.seq: o for o, r in records.items() if isinstance(r, Pass)})


def write_copy(source: Path, dest: Path, *, framed: bool, batch: int, close: bool, upto: int | None = None,
               version: int | None = None) -> Path:
    with TraceReader(source) as reader:
        records = [r for _, r in reader.records()][1 : upto]
        writer = TraceWriter(dest, reader.header, framed=framed, version=version, fsync_every_s=None)
    for start in range(0, len(records), batch):
        writer.write_many(records[start : start + batch])
    writer.close(1) if close else writer.abandon()
    return dest


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> list[Base]:
    folder = tmp_path_factory.mktemp("fuzz-bases")
    synthetic = folder / "synthetic.trace"
    generate(synthetic, 1500, seed=11)
    made = [
        ("fcfs-v1", FCFS),
        ("lpm-v1", LPM),
        ("fcfs-framed-v1", write_copy(FCFS, folder / "f1.trace", framed=True, batch=64, close=True, version=1)),
        ("fcfs-v2", write_copy(FCFS, folder / "ff.trace", framed=True, batch=64, close=True)),
        ("fcfs-v2-unclosed", write_copy(FCFS, folder / "fu.trace", framed=True, batch=64, close=False)),
        ("synthetic-v2", synthetic),
        ("lpm-v1-unclosed", write_copy(LPM, folder / "lu.trace", framed=False, batch=64, close=False,
                                       upto=1500)),
    ]
    return [load_base(name, path) for name, path in made]


@dataclass
class Mutation:
    kind: str
    data: bytes
    start: int  # first changed byte, in the mutated file
    end: int  # just past the changed bytes (inserted: the inserted ones)
    shift: int = 0  # bytes inserted at ``start``: originals at or after it moved by this much

    def original_offset(self, offset: int) -> int | None:
        if offset < self.start:
            return offset
        if offset < self.start + self.shift:
            return None
        return offset - self.shift

    def touches(self, start: int, end: int) -> bool:
        """Whether original bytes [start, end) were changed or cut off."""
        if self.kind == "truncate":
            return end > self.start
        return start < self.end - self.shift and end > self.start


def mutate(base: Base, rng: random.Random) -> Mutation:
    data = bytearray(base.data)
    size = len(data)
    boundaries = sorted(base.records)
    kind = rng.choice(["truncate", "flip", "flip", "overwrite", "footer", "hostile", "splice"])
    if kind == "truncate":
        cut = rng.randrange(1, size)
        return Mutation(kind, bytes(data[:cut]), cut, size)
    if kind in ("flip", "overwrite"):
        at = rng.randrange(size)
        width = rng.randint(1, 64)
        end = min(size, at + width)
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(at, end)] ^= 1 << rng.randrange(8)
        else:
            data[at:end] = rng.randbytes(end - at)
        return Mutation(kind, bytes(data), at, end)
    if kind == "footer":  # the footer, its index or the tail (or the last records of an unclosed file)
        at = rng.randrange(max(0, size - rng.choice([15, 200, 4000])), size)
        end = min(size, at + rng.randint(1, 8))
        data[at:end] = rng.randbytes(end - at)
        return Mutation(kind, bytes(data), at, end)
    hostile = rng.choice(HOSTILE)
    at = rng.choice(boundaries[1:])
    if kind == "hostile":
        end = min(size, at + len(hostile))
        data[at:end] = hostile[: end - at]
        return Mutation(kind, bytes(data), at, end)
    data[at:at] = hostile
    return Mutation(kind, bytes(data), at, at + len(hostile), shift=len(hostile))


@dataclass
class Outcome:
    read: set[int]  # original offsets read back
    opened: bool = False  # the reader accepted the file (refusing one is allowed only for a damaged header)
    error_at: int | None = None
    gaps: tuple = ()
    truncated_at: int | None = None
    unchecked_from: int | None = None
    closed_cleanly: bool = False


def read_case(path: Path, base: Base, mutation: Mutation, size: int) -> Outcome:
    outcome = Outcome(read=set())
    try:
        with TraceReader(path, skip_damaged=True, max_record_bytes=MAX_RECORD) as reader:
            outcome.opened = True
            outcome.gaps = tuple(reader.gaps)
            outcome.truncated_at, outcome.unchecked_from = reader.truncated_at, reader.unchecked_from
            outcome.closed_cleanly = reader.closed_cleanly
            for offset, record in reader.records():
                check_record(base, mutation, offset, record, outcome)
            for n in sorted({0, reader.pass_count - 1, *random.Random(size).sample(range(reader.pass_count),
                                                                                   min(20, reader.pass_count))}):
                if not 0 <= n < reader.pass_count:
                    continue
                try:
                    found = reader.pass_at(n)
                except TraceDamagedError:
                    continue
                check_pass(base, mutation, reader.pass_offsets[n], found, reader.unchecked_from)
    except TraceVersionError:
        assert not base.framed and mutation.start < header_end(base), "a version error, the header untouched"
        outcome.error_at = 0
    except TraceFormatError as exc:
        assert 0 <= exc.offset < size, f"error offset {exc.offset} outside the file ({size} bytes): {exc}"
        outcome.error_at = exc.offset
        if not outcome.opened:
            assert mutation.start < header_end(base) + 35 or mutation.kind == "truncate" and mutation.start < 200, \
                f"refused a file whose header was not touched: {exc}"
    return outcome


def header_end(base: Base) -> int:
    return min(offset for offset in base.records if offset > 0)


def checked(base: Base, offset: int, unchecked_from: int | None) -> bool:
    return base.framed and (unchecked_from is None or offset < unchecked_from)


def check_record(base: Base, mutation: Mutation, offset: int, record: object, outcome: Outcome) -> None:
    original = mutation.original_offset(offset)
    known = base.records.get(original) if original is not None else None
    if known is not None and record == known[1]:
        outcome.read.add(original)
        return
    assert not checked(base, offset, outcome.unchecked_from), f"record at checked offset {offset} is not the original"
    if known is not None:
        assert mutation.touches(base.keyframe_of.get(original, original), known[0]), \
            f"record at {offset} differs, its bytes (and its keyframe's and deltas') were not touched"
    else:
        assert offset >= mutation.start, f"a record at {offset}, where none was, before the mutation"


def check_pass(base: Base, mutation: Mutation, offset: int, found: Pass, unchecked_from: int | None) -> None:
    original = mutation.original_offset(offset)
    known = base.records.get(original) if original is not None else None
    if known is not None and found == known[1]:
        assert found == base.passes[found.seq]
        return
    assert not checked(base, offset, unchecked_from), f"pass {found.seq} at checked offset {offset} is not the original"
    if known is not None:
        assert mutation.touches(base.keyframe_of.get(original, original), known[0]), \
            f"pass at {offset} differs, its bytes (and its keyframe's and deltas') were not touched"
    else:
        assert offset >= mutation.start, f"a pass at {offset}, where none was, before the mutation"


def orphaned(base: Base, offset: int, read: set[int]) -> bool:
    """v2: a delta pass whose chain back to its keyframe holds a pass that was not read."""
    keyframe = base.keyframe_of.get(offset, offset)
    if keyframe == offset:
        return False
    first, seq = base.records[keyframe][1].seq, base.records[offset][1].seq
    return any(base.pass_offset[s] not in read for s in range(first, seq))


def check_completeness(base: Base, mutation: Mutation, outcome: Outcome) -> None:
    """Framed: every original record is read back, or said to be lost (gap, torn tail, error)."""
    if not outcome.opened:
        return  # refused for a damaged header (checked in read_case)
    moved = [(offset if offset < mutation.start else offset + mutation.shift, offset) for offset in base.records]
    orphans = 0
    for where, original in moved:
        if original in outcome.read:
            continue
        if mutation.kind == "truncate" and base.records[original][0] > mutation.start:
            continue  # cut off
        if outcome.error_at is not None and where >= min(outcome.error_at, mutation.start):
            continue  # reading stopped there
        if outcome.truncated_at is not None and where >= outcome.truncated_at:
            continue
        if any(gap.start <= where < max(gap.end, gap.start + 1) for gap in outcome.gaps):
            continue
        if orphaned(base, original, outcome.read):
            orphans += 1
            continue
        raise AssertionError(f"original record at {original} neither read nor reported lost")
    if outcome.error_at is None:
        assert sum(gap.orphans for gap in outcome.gaps) == orphans, f"gaps say {outcome.gaps} orphans, {orphans} lost"
    for gap in outcome.gaps:
        if gap.lost is not None and outcome.error_at is None and gap.end > gap.start:
            held = sum(1 for where, _ in moved if gap.start <= where < gap.end)
            assert gap.lost == held, f"gap {gap} says {gap.lost} records lost, it held {held}"
    if outcome.closed_cleanly:
        assert outcome.read == set(base.records), "closed cleanly, but records were not read back"


def test_fuzz_the_reader_contract(bases: list[Base], tmp_path: Path) -> None:
    only = os.environ.get("FUZZ_ONLY")
    path = tmp_path / "case.trace"
    ran = 0
    for base_index, base in enumerate(bases):
        for case in range(CASES_PER_BASE):
            if only and only != f"{base.name}:{case}":
                continue
            rng = random.Random(f"{SEED}{base.name}:{case}")
            mutation = mutate(base, rng)
            path.write_bytes(mutation.data)
            traced = mutation.kind in ("hostile", "splice") or case % 15 == 0
            if traced:
                tracemalloc.start()
            try:
                outcome = read_case(path, base, mutation, len(mutation.data))
                if base.framed:
                    check_completeness(base, mutation, outcome)
                if traced:
                    peak = tracemalloc.get_traced_memory()[1]
                    assert peak < PEAK_LIMIT, f"peak memory {peak:,} bytes"
            except AssertionError as failure:
                raise AssertionError(f"{base.name}:{case} {mutation.kind} at {mutation.start}-{mutation.end}: "
                                     f"{failure}") from failure
            finally:
                if traced:
                    tracemalloc.stop()
            ran += 1
    assert ran == (1 if only else len(bases) * CASES_PER_BASE)


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "v1"])
def test_fuzz_every_cut_of_a_small_trace(tmp_path: Path, framed: bool) -> None:
    """Truncation at every byte of the header and its marker, and around every record and batch boundary:
    the whole records before the cut read back, nothing else, and no error unless the header is cut."""
    source = write_copy(FCFS, tmp_path / "small.trace", framed=framed, batch=5, close=True, upto=60)
    base = load_base("small", source)
    path = tmp_path / "cut.trace"
    edges = {edge for offset, (end, _) in base.records.items() for edge in (offset, end)}
    cuts = set(range(1, header_end(base) + 40)) | {e + d for e in edges for d in (-1, 0, 1, 36)}
    for cut in sorted(c for c in cuts | set(range(1, len(base.data), 101)) if 0 < c < len(base.data)):
        path.write_bytes(base.data[:cut])
        mutation = Mutation("truncate", base.data[:cut], cut, len(base.data))
        outcome = read_case(path, base, mutation, cut)
        assert outcome.error_at is None or cut < header_end(base), f"cut at {cut}: error at {outcome.error_at}"
        whole = {o for o, (end, _) in base.records.items() if end <= (outcome.truncated_at or cut)}
        if framed:
            check_completeness(base, mutation, outcome)
        assert outcome.read <= whole
