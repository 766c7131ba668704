"""Hostile traces (issue 23): crafted files with valid checksums, and damage that moves batches.

    python -m bench.bench_hostile [--cases 40] [--seed 0]

A trace is untrusted and its checksum seed comes from its header, so anyone
can write a file whose every batch checks out. Each family below builds such
files (seeded, deterministic) or damages a real trace; ``read_contract``
reads one every way the reader offers and fails on a broken promise:

* nothing but ``SchedtraceError`` escapes (strict reading, ``skip_damaged``,
  ``convert``);
* every number the file claims is bounded by its size: ``pass_count``, each
  gap's lost count (``MIN_RECORD_BYTES`` a record), each rebuilt list
  (``MIN_ROW_BYTES`` a row), the rows of all the passes a read returns
  (``cost_allowed``: the rows the deltas' bytes pay for, and their own);
* every record the family wrote is read back as written, or lies in a
  reported gap (its bytes, or the passes it orphans).

tests/test_hostile.py runs a few cases of every family; this prints, per
family, the cases, the failures, the slowest read and the peak RSS.
"""

from __future__ import annotations

import random
import resource
from array import array
import struct
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import click

from schedtrace.testing.builders import header, pass_record
from schedtrace.tracer.contract.codec import PASS_TAGS, encode, offsets_to_bytes, peek_tag
from schedtrace.tracer.contract.convert import convert_trace
from schedtrace.tracer.contract.errors import SchedtraceError, TraceDamagedError
from schedtrace.tracer.contract.format import TraceReader, TraceWriter
from schedtrace.tracer.contract.framing import MARKER_PREFIX, MARKER_SIZE, MIN_RECORD_BYTES, header_seed, marker_bytes
from schedtrace.tracer.contract.keyframes import cost_allowed
from schedtrace.tracer.contract.names import BUILT_ROWS_PER_BYTE, SEEK_BYTES
from schedtrace.tracer.contract.pass_chain import MIN_ROW_BYTES
from schedtrace.tracer.contract.pass_index import MIN_PASS_BYTES
from schedtrace.tracer.contract.schema import (TAIL_PREFIX, Arrival, Footer, KvSnapshot, Pass, PassDelta, RunningReq,
                                               WaitingReq)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "traces" / "kv-pressure-fcfs.trace"
BIG = 1 << 64


# --- writing files by hand, with valid checksums ---


@dataclass
class Crafted:
    """A file and what was written into it: data offset -> the record there (whole passes for deltas)."""

    path: Path
    records: dict[int, object] = field(default_factory=dict)
    framed: bool = True


class Crafter:
    """Writes batches of raw records with markers that check out, counting records as the writer does."""

    def __init__(self, path: Path, version: int = 2) -> None:
        head = encode(header(schema_version=version))
        marker = marker_bytes(0, 1, b"", header_seed(head))
        self.seed = int.from_bytes(marker[-8:], "big")
        self.data = bytearray(head + marker)
        self.count = 1  # records before the next batch (the header is record 0)
        self.passes: list[int] = []
        self.keyframes: list[int] = []
        self.crafted = Crafted(path)

    def batch(self, records: list, *, before: int | None = None, expect: bool = True) -> None:
        """One batch; ``records`` are Structs or raw bytes; ``before`` overrides its records_before."""
        payload = bytearray()
        start = len(self.data) + MARKER_SIZE
        for record in records:
            at = start + len(payload)
            raw = record if isinstance(record, bytes) else encode(record)
            tag = peek_tag(raw)
            if tag in PASS_TAGS:
                if tag == "pass":
                    self.keyframes.append(len(self.passes))
                self.passes.append(at)
            if expect and not isinstance(record, bytes):
                self.crafted.records[at] = record
            payload += raw
        self.data += marker_bytes(self.count if before is None else before, len(records), payload, self.seed)
        self.data += payload
        self.count = (self.count if before is None else before) + len(records)

    def raw(self, data: bytes) -> None:
        self.data += data

    def done(self, *, close: bool = False, counts: dict[str, int] | None = None, before: int | None = None) -> Crafted:
        if close:
            footer = encode(Footer(t_ns=1, counts=counts if counts is not None else {"pass": len(self.passes)},
                                   pass_offsets=offsets_to_bytes(array("Q", self.passes)),
                                   keyframes=offsets_to_bytes(array("Q", self.keyframes))))
            footer_at = len(self.data) + MARKER_SIZE
            self.data += marker_bytes(self.count if before is None else before, 1, footer, self.seed) + footer
            self.data += TAIL_PREFIX + footer_at.to_bytes(8, "big")
        self.crafted.path.write_bytes(bytes(self.data))
        return self.crafted


def a_pass(seq: int, waiting: int = 0, running: int = 0, **fields) -> Pass:
    return pass_record(seq, kv=KvSnapshot(available=100, evictable=0),
                       waiting=[WaitingReq(f"w{i}", 5, 0, 4, 0) for i in range(waiting)],
                       running=[RunningReq(f"r{i}", 5, 1, 9) for i in range(running)], **fields)


def a_delta(seq: int, **fields) -> PassDelta:
    base = dict(seq=seq, dt_ns=1, dur_ns=1, repeat=1, idle_before=0, waiting_runs=[], waiting_new=[],
                running_runs=[], running_new=[], running_step=0, chunked=None, batch_is_full_in=False,
                kv=KvSnapshot(0, 0), req_slots_free=0, new_token_ratio=0.0, chunked_prefill_size=None,
                candidates=[], admitted=[], chunk=None, new_chunked_rid=None, batch_is_full_out=False)
    return PassDelta(**(base | fields))


# --- the crafted families ---


def doubling(path: Path, rng: random.Random) -> Crafted:
    """Each delta copies the list before it twice: 2 KB of deltas would make millions of rows."""
    c = Crafter(path)
    c.batch([a_pass(0, waiting=2, running=2)])
    n = 2
    step = rng.choice([0, 1])
    deltas = []
    for seq in range(1, rng.randint(20, 40)):
        deltas.append(a_delta(seq, waiting_runs=[0, n, 0, n], running_runs=[0, n, 0, n], running_step=step))
        n *= 2
    c.batch(deltas, expect=False)
    return c.done(close=rng.random() < 0.5)


def long_chain(path: Path, rng: random.Random, rows: int | None = None) -> Crafted:
    """One keyframe of many rows and 1023 deltas of a few bytes that copy them all, stepping every row: past
    the first few dozen, the rows they would have a reader build are more than their bytes pay for."""
    c = Crafter(path)
    rows = rows or rng.randint(500, 3000)
    c.batch([a_pass(0, waiting=rows, running=rows)])
    for first in range(1, 1024, 256):
        c.batch([a_delta(seq, waiting_runs=[0, rows], running_runs=[0, rows], running_step=1)
                 for seq in range(first, min(first + 256, 1024))], expect=False)
    return c.done(close=rng.random() < 0.5)


def big_pass(path: Path, rng: random.Random) -> Crafted:
    """A pass record past SEEK_BYTES (a keyframe, or a v1 pass) between honest passes: a seek would decode it all."""
    version = rng.choice([1, 2])
    c = Crafter(path, version=version)
    rows = SEEK_BYTES // 10 + rng.randint(1, 5000)  # some 11 bytes a row ("r12345" and four small ints)
    c.batch([a_pass(0, running=2)])
    c.batch([a_pass(1, running=rows)], expect=False)
    c.batch([Arrival(2, "a", 1, 1), a_pass(2, running=2)])
    if version == 2:
        c.batch([a_delta(3, running_runs=[0, 2], running_step=1)], expect=False)
    return c.done(close=rng.random() < 0.5)


def wide_chain(path: Path, rng: random.Random) -> Crafted:
    """Deltas of many fresh rows each, within the rows their bytes pay for: past SEEK_BYTES of pass records from
    their keyframe, a seek would decode them all."""
    c = Crafter(path)
    rows = rng.randint(4000, 12000)
    fresh = [RunningReq(f"r{i}", 5, 1, 9) for i in range(rows)]  # some 11 bytes a row
    c.batch([a_pass(0, running=2)])
    for seq in range(1, SEEK_BYTES // (rows * 11) + 3):
        c.batch([a_delta(seq, running_runs=[-1, rows], running_new=fresh)], expect=False)
    c.batch([a_pass(seq + 1, running=2)])
    return c.done(close=rng.random() < 0.5)


def claimed_loss(path: Path, rng: random.Random) -> Crafted:
    """An unclosed file whose marker after a damaged stretch claims far more records than it could hold."""
    c = Crafter(path)
    c.batch([a_pass(0)])
    c.raw(rng.randbytes(rng.randint(1, 200)))
    claim = rng.choice([10**8, 1 << 40, (1 << 63) - 5])
    c.batch([a_pass(claim - 1, t_ns=1)], before=claim)
    c.batch([a_pass(claim, t_ns=2), Arrival(1, "x", 1, 1)])
    return c.done()


def fake_markers(path: Path, rng: random.Random) -> Crafted:
    """Markers every 35 bytes that claim a long batch and fail their checksum, between good batches."""
    c = Crafter(path)
    c.batch([a_pass(0), Arrival(1, "a", 1, 1)])
    fakes = rng.randint(200, 2000)
    span = fakes * MARKER_SIZE
    for i in range(fakes):
        c.raw(struct.pack(">8sQBIBIB", MARKER_PREFIX, c.count + rng.randint(0, 2), 0xCE, 1, 0xCE,
                          span - i * MARKER_SIZE, 0xCF) + rng.randbytes(8))
    c.batch([a_pass(1), Arrival(2, "b", 1, 1)], before=c.count + rng.randint(0, 3))
    return c.done(close=rng.random() < 0.5)


def overflow(path: Path, rng: random.Random) -> Crafted:
    """Deltas whose numbers rebuild past what a record holds: t_ns past uint64, output_len past int64."""
    c = Crafter(path)
    c.batch([a_pass(0, running=2, t_ns=rng.choice([1, (1 << 63) - 1]))])
    bad = rng.choice([dict(dt_ns=BIG - 1), dict(running_runs=[0, 2], running_step=BIG - 1),
                      dict(running_runs=[0, 2], running_step=-(1 << 63))])
    c.batch([a_delta(1, **bad)], expect=False)
    c.batch([a_pass(2), Arrival(3, "a", 1, 1)])
    return c.done(close=rng.random() < 0.5)


def schema_invalid(path: Path, rng: random.Random) -> Crafted:
    """Records that are msgpack but not the schema (a rid of invalid UTF-8, a field of the wrong type)."""
    c = Crafter(path, version=rng.choice([1, 2]))
    bad_rid = b"\xa2\xff\xfe"
    bad = rng.choice([
        b"\x94\xa6arrive\x01" + bad_rid + b"\x01",  # arrive: t_ns, rid (not UTF-8), input_len; short too
        b"\x95\xa6arrive\x01" + bad_rid + b"\x01\x01",
        encode(a_pass(1))[:-1] + b"\xa3abc",  # a pass whose last field is a str where an int belongs
        b"\x93\xa4pass\x01\xa1x",  # a pass of three fields
        b"\x92\xa4idle\xc0",
    ])
    c.batch([a_pass(0), Arrival(1, "a", 1, 1)])
    after = 2 if peek_tag(bad) == "pass" else 1  # a bad pass still takes its number
    c.batch([Arrival(2, "b", 1, 1), bad, a_pass(after)])
    c.batch([Arrival(3, "c", 1, 1), a_pass(after + 1)])
    return c.done(close=False)


def bad_seq(path: Path, rng: random.Random) -> Crafted:
    """Checked passes whose seq is not their place, and a batch that checks out but is not msgpack."""
    c = Crafter(path)
    c.batch([a_pass(0)])
    wrong = rng.choice([0, 7, 1 << 40])
    c.batch([Arrival(1, "a", 1, 1), a_pass(wrong)], expect=False)
    c.batch([b"\xc1" * rng.randint(2, 40)], expect=False)
    c.batch([a_pass(1), Arrival(2, "b", 1, 1)])
    return c.done(close=False)


def footer_lies(path: Path, rng: random.Random) -> Crafted:
    """A closed file whose footer's marker or counts claim what the file cannot hold."""
    c = Crafter(path)
    c.batch([a_pass(0), Arrival(1, "a", 1, 1), a_pass(1)])
    lie = rng.choice(["before", "negative", "records"])
    if lie == "before":
        return c.done(close=True, before=1 << 40)
    counts = {"pass": 2, "lost": -1} if lie == "negative" else {"pass": 2, "arrive": 10**9}
    return c.done(close=True, counts=counts)


CRAFTED: dict[str, Callable[[Path, random.Random], Crafted]] = {
    "doubling": doubling, "long-chain": long_chain, "claimed-loss": claimed_loss, "fake-markers": fake_markers,
    "overflow": overflow, "schema-invalid": schema_invalid, "bad-seq": bad_seq, "footer-lies": footer_lies,
    "big-pass": big_pass, "wide-chain": wide_chain,
}


# --- damage that moves batches, on a real trace ---


def sample_base(path: Path, version: int = 2, batch: int = 64, close: bool = True) -> tuple[Crafted, list[int]]:
    """The fcfs sample rewritten framed, ``batch`` records a write; its records and its batch offsets."""
    with TraceReader(SAMPLE) as reader:
        records = [r for _, r in reader.records()][1:1500]
        head = reader.header
    writer = TraceWriter(path, head, version=version, fsync_every_s=None)
    starts = []
    for i in range(0, len(records), batch):
        starts.append(writer.size)
        writer.write_many(records[i : i + batch])
    starts.append(writer.size)
    writer.close(1) if close else writer.abandon()
    with TraceReader(path) as reader:
        crafted = Crafted(path, dict(reader.records()))
    del crafted.records[0]
    return crafted, starts


def swapped(path: Path, rng: random.Random, base: tuple[Crafted, list[int]], duplicate: bool = False) -> Crafted:
    """Two non-adjacent batches swapped (or the later one copied in again after the first); the footer is kept."""
    crafted, s = base
    i = rng.randrange(len(s) - 3)
    j = rng.randrange(i + 2, len(s) - 1)
    end = crafted.path.stat().st_size
    spans = ([(0, s[i + 1], True), (s[j], s[j + 1], False), (s[i + 1], end, True)] if duplicate else
             [(0, s[i], True), (s[j], s[j + 1], True), (s[i + 1], s[j], True), (s[i], s[i + 1], True),
              (s[j + 1], end, True)])
    data, out, moved = crafted.path.read_bytes(), bytearray(), {}
    for start, stop, own in spans:  # a copy carries no record of its own: the originals are elsewhere
        if own:
            moved.update({o - start + len(out): r for o, r in crafted.records.items() if start <= o < stop})
        out += data[start:stop]
    path.write_bytes(bytes(out))
    return Crafted(path, moved)


def damaged_v1(path: Path, rng: random.Random, base: tuple[Crafted, list[int]]) -> Crafted:
    """An unframed v1 file with a few bytes flipped or overwritten: no checksum says what is good."""
    data = bytearray(base[0].path.read_bytes())
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(200, len(data))
        if rng.random() < 0.5:
            data[at] ^= 1 << rng.randrange(8)
        else:
            data[at : at + 8] = rng.randbytes(8)
    path.write_bytes(bytes(data))
    return Crafted(path, {}, framed=False)


# --- the contract ---


CONVERT_BELOW: Final = 64 << 10  # files converted to v1 too (a long chain's v1 copy is many times its size)


@dataclass
class Read:
    passes: int = 0
    rows: int = 0  # the longest rebuilt list
    built: int = 0  # the rows of every pass returned, in all
    gaps: int = 0
    check_s: float = 0.0  # opening, the integrity check and the pass index
    read_s: float = 0.0  # then every record, and pass_at of a sample of passes, each cold


def read_contract(crafted: Crafted) -> Read:
    """Read ``crafted`` every way and check the promises (module doc); AssertionError names the broken one."""
    path, size = crafted.path, crafted.path.stat().st_size
    out = Read()
    try:
        _strict(path, convert=size < CONVERT_BELOW)
        began = time.perf_counter()
        with TraceReader(path, skip_damaged=True) as reader:
            out.passes, out.gaps = reader.pass_count, len(reader.gaps)
            out.check_s = time.perf_counter() - began
            returned = {}  # only the records the family knows: a long file's passes are not all kept
            for offset, record in reader.records():
                if offset in crafted.records:
                    returned[offset] = record
                _check_rows(record, size, out)
            offsets = reader.pass_offsets
            for n in random.Random(size).sample(range(out.passes), min(10, out.passes)):
                reader._chain._last = None  # cold: from its keyframe  # noqa: SLF001
                try:
                    _check_rows(reader.pass_at(n), size, out)
                except TraceDamagedError:
                    continue
            gaps, torn = reader.gaps, reader.truncated_at
            out.gaps = len(gaps)
        out.read_s = time.perf_counter() - began - out.check_s
    except SchedtraceError:
        return out  # refused, or (strict only) stopped: allowed
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        raise AssertionError(f"{type(exc).__name__} escaped: {exc}") from exc
    assert out.passes <= size // MIN_PASS_BYTES + 1, f"pass_count {out.passes} from {size} bytes"
    # every row returned is at least a copy, paid for by the budget or by its own bytes
    assert out.built <= cost_allowed(size) + 2 * (size // MIN_ROW_BYTES), f"{out.built:,} rows from {size:,} bytes"
    for gap in gaps:
        assert gap.lost is None or gap.lost <= (gap.end - gap.start) // MIN_RECORD_BYTES, f"{gap} claims too much"
    lost = _lost_passes(gaps, offsets)
    for offset, record in crafted.records.items():
        if torn is not None and offset >= torn:
            continue  # past a torn tail: the file ends there
        if offset in returned:
            if crafted.framed:
                assert returned[offset] == record, f"record at {offset} is not what was written"
            continue
        if any(g.start <= offset < max(g.end, g.start + 1) for g in gaps):
            continue
        n = bisect_left(offsets, offset)
        assert n < len(offsets) and offsets[n] == offset and n in lost, \
            f"record at {offset} ({type(record).__name__}) neither read nor in a gap: {gaps}"
    return out


def _strict(path: Path, convert: bool) -> None:
    """Strict reading and ``convert`` may stop, but only with the error tree."""
    try:
        with TraceReader(path) as reader:
            for _ in reader.records():
                pass
    except SchedtraceError:
        pass
    if not convert:
        return
    dest = path.with_suffix(".v1")
    dest.unlink(missing_ok=True)
    try:
        convert_trace(path, dest, version=1)
    except SchedtraceError:
        pass
    dest.unlink(missing_ok=True)


def _check_rows(record: object, size: int, out: Read) -> None:
    if type(record) is Pass:
        rows = max(len(record.waiting), len(record.running))
        out.rows = max(out.rows, rows)
        assert rows <= size // MIN_ROW_BYTES + 1, f"a pass of {rows} rows from {size} bytes"
        out.built += len(record.waiting) + len(record.running)


def _lost_passes(gaps, offsets) -> set[int]:
    """Pass numbers a gap accounts for: those indexed inside it, then its orphans."""
    lost: set[int] = set()
    for gap in gaps:
        first = bisect_left(offsets, gap.start)
        stop = bisect_left(offsets, max(gap.end, gap.start + 1)) + gap.orphans
        lost.update(range(first, min(stop, len(offsets))))
    return lost


def cases(family: str, count: int, folder: Path, seed: str = "") -> list[tuple[str, Crafted]]:
    """``count`` files of ``family``, seeded (each case is rebuilt from its name alone)."""
    made = []
    bases: dict[str, tuple[Crafted, list[int]]] = {}
    for case in range(count):
        rng = random.Random(f"{seed}{family}:{case}")
        path = folder / f"{family}-{case}.trace"
        if family in CRAFTED:
            made.append((f"{family}:{case}", CRAFTED[family](path, rng)))
            continue
        key = "v1" if family == "damaged-v1" else "v2"
        if key not in bases:
            base_path = folder / f"base-{key}.trace"
            bases[key] = (_unframed(base_path), []) if key == "v1" else sample_base(base_path)
        if family == "damaged-v1":
            made.append((f"{family}:{case}", damaged_v1(path, rng, bases[key])))
        else:
            made.append((f"{family}:{case}", swapped(path, rng, bases[key], duplicate=family == "duplicate")))
    return made


def _unframed(path: Path) -> Crafted:
    with TraceReader(SAMPLE) as reader:
        records = [r for _, r in reader.records()]
    writer = TraceWriter(path, records[0], framed=False, fsync_every_s=None)
    writer.write_many(records[1:1500])
    writer.close(1)
    return Crafted(path, {}, framed=False)


FAMILIES = (*CRAFTED, "swap", "duplicate", "damaged-v1")


# --- the slowest seeks the rules allow ---


def worst_seeks(folder: Path) -> dict[str, Path]:
    """Files as slow to seek in as the format allows (SEEK_BYTES of pass records from a keyframe, of rows that
    encode in MIN_ROW_BYTES), each read by a cold ``pass_at`` of its last pass."""
    rows = (SEEK_BYTES - 200) // MIN_ROW_BYTES
    files = {}
    c = Crafter(folder / "stepped.trace")  # one keyframe, one delta stepping every row: all built anew
    c.batch([_least(pass_record(0, kv=KvSnapshot(100, 0), waiting=[], running=[_ROW] * rows))])
    c.batch([a_delta(1, running_runs=[0, rows], running_step=1)])
    files["a keyframe, then every row stepped"] = c.done(close=True).path
    c = Crafter(folder / "fresh.trace")  # deltas of fresh rows up to the budget: every byte decoded
    per = rows // 8
    c.batch([a_pass(0)])
    c.batch([_least(a_delta(seq, running_runs=[-1, per], running_new=[_ROW] * per)) for seq in range(1, 8)])
    files["7 deltas of fresh rows"] = c.done(close=True).path
    c = Crafter(folder / "chain.trace")  # as many deltas stepping every row as the rebuild budget allows
    deltas = BUILT_ROWS_PER_BYTE * MIN_ROW_BYTES - 1
    kept = rows - deltas * 64 // MIN_ROW_BYTES  # room for the deltas' own bytes
    c.batch([_least(pass_record(0, kv=KvSnapshot(100, 0), waiting=[], running=[_ROW] * kept))])
    c.batch([a_delta(seq, running_runs=[0, kept], running_step=1) for seq in range(1, deltas + 1)])
    files[f"{deltas} deltas stepping every row"] = c.done(close=True).path
    return files


_ROW = RunningReq("", 0, 0, 0)


def _least(record: object) -> bytes:
    """``record`` encoded with its running rows in MIN_ROW_BYTES each (ignore_eos left to its default)."""
    return encode(record).replace(encode(_ROW), encode(_ROW)[:-1].replace(b"\x95", b"\x94", 1))


def seek_report(folder: Path, runs: int = 5) -> None:
    """Each worst file's cold pass_at (the median and slowest of ``runs``), against decoding its records alone."""
    print(f"\nthe slowest seeks the format allows (SEEK_BYTES {SEEK_BYTES:,}); {runs} runs, each a fresh reader")
    print(f"{'file':<36} {'bytes':>10} {'passes':>7} {'pass_at':>10} {'slowest':>9} {'decode alone':>20}")
    for name, path in worst_seeks(folder).items():
        timings, decodes = [], []
        for _ in range(runs):
            with TraceReader(path) as reader:
                last = reader.pass_count - 1
                began = time.perf_counter()
                reader.pass_at(last)
                timings.append(time.perf_counter() - began)
                began = time.perf_counter()
                for _ in reader._raw_records(0):  # noqa: SLF001 - the records as stored, nothing rebuilt
                    pass
                decodes.append(time.perf_counter() - began)
        timings.sort()
        seek, decode = timings[runs // 2], sorted(decodes)[runs // 2]
        print(f"{name:<36} {path.stat().st_size:>10,} {last + 1:>7} {seek * 1e3:>8.1f}ms "
              f"{timings[-1] * 1e3:>7.1f}ms {decode * 1e3:>9.1f}ms ({seek / decode:.1f}x)")


def scan_report(folder: Path, size: int = 1 << 20) -> None:
    """The slowest whole reads per MB found: a gap every 4 bytes (a 1-byte non-record between 3-byte records of an
    unknown tag), and checked batches of 1-byte non-records; each read with ``skip_damaged`` by a fresh reader."""
    print(f"\nwhole reads of the slowest files found ({size:,} bytes of damage; open, check, index, every record)")
    shapes = {"a gap every 4 bytes": [b"\x00", b"\x91\xa1x"] * 1024, "1-byte non-records": [b"\x00"] * 4096}
    for name, unit in shapes.items():
        c = Crafter(folder / "scan.trace")
        c.batch([a_pass(0)])
        for _ in range(size // sum(map(len, unit))):
            c.batch(unit, expect=False)
        c.batch([a_pass(1)])
        path = c.done().path
        began = time.perf_counter()
        with TraceReader(path, skip_damaged=True) as reader:
            for _ in reader.records():
                pass
            gaps = len(reader.gaps)
        took = time.perf_counter() - began
        print(f"{name:<22} {gaps:>9,} gaps {took:>7.2f} s, {took / (path.stat().st_size / 1e6):.2f} s/MB", flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@click.command()
@click.option("--cases", "count", default=40, show_default=True, help="cases per family")
@click.option("--seed", default="", help="another seed, another set of cases")
def main(count: int, seed: str) -> None:
    print("check: open, integrity check and pass index; read: every record, then 10 cold pass_at")
    print(f"{'family':<15} {'cases':>6} {'failed':>7} {'max file':>10} {'check':>9} {'read':>9} "
          f"{'max rows':>9} {'peak RSS':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for family in FAMILIES:
            failed, check, read, biggest, rows = 0, 0.0, 0.0, 0, 0
            for name, crafted in cases(family, count, Path(folder), seed):
                try:
                    result = read_contract(crafted)
                except AssertionError as failure:
                    failed += 1
                    print(f"  FAIL {name}: {failure}")
                    continue
                check, read = max(check, result.check_s), max(read, result.read_s)
                biggest, rows = max(biggest, crafted.path.stat().st_size), max(rows, result.rows)
                crafted.path.unlink()
            print(f"{family:<15} {count:>6} {failed:>7} {biggest:>10,} {check * 1e3:>7.1f}ms {read * 1e3:>7.1f}ms "
                  f"{rows:>9,} {peak_rss_mb():>7.0f}MB", flush=True)
        seek_report(Path(folder))
        scan_report(Path(folder))


if __name__ == "__main__":
    main()
