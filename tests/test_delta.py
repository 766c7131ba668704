"""Format v2 (issue 15): keyframes and deltas read back as the whole passes that were written.

Every case compares against the passes themselves: the v1 samples converted
to v2, and generated traces whose queue and running batch change in every
way the scheduler changes them (joins, leaves, retractions, reorders, field
changes, chunk progress, uneven decode steps) across rotated parts.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import msgspec
import pytest

from schedtrace.testing import builders
from schedtrace.tracer.contract.codec import offsets_from_bytes, peek_tag
from schedtrace.tracer.contract.convert import convert_trace
from schedtrace.tracer.contract.delta import COPIED, RUNNING_FIELDS, Differ, rebuild
from schedtrace.tracer.contract.errors import TraceDamagedError
from schedtrace.tracer.contract.format import FileOps, TraceReader, TraceWriter
from schedtrace.tracer.contract.frames import frame_end
from schedtrace.tracer.contract.keyframes import (DEFAULT_BYTES_RATIO, DEFAULT_WALK_BYTES, MAX_KEYFRAME_INTERVAL,
                                                  KeyframePolicy)
from schedtrace.tracer.contract.names import LOSS_PASS_TOO_LARGE, SEEK_BYTES
from schedtrace.tracer.contract.schema import (
    Admitted,
    Alloc,
    Arrival,
    Candidate,
    ChunkedReq,
    ChunkOutcome,
    Finish,
    KvSnapshot,
    Loss,
    Pass,
    PassDelta,
    Retract,
    RunningReq,
    WaitingReq,
)
from schedtrace.tracer.contract.traceset import open_traceset

SAMPLES = sorted((Path(__file__).resolve().parent.parent / "traces").glob("*.trace"))
FCFS_SAMPLE = Path(__file__).resolve().parent / "traces" / "v1-kv-pressure-fcfs.trace"  # a v1 recording


# --- a scheduler-like stream of passes ------------------------------------------------------------


class Model:
    """A queue, a running batch and a chunked request that change as sglang's do, with events between."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.waiting: list[WaitingReq] = []
        self.running: list[RunningReq] = []
        self.chunked: ChunkedReq | None = None
        self.next_rid = 0
        self.t_ns = 0

    def _arrive(self, events: list) -> None:
        rng = self.rng
        rid = f"{self.next_rid:032x}"  # sglang's rids are 32 hex digits
        self.next_rid += 1
        self.waiting.append(WaitingReq(rid, rng.randint(10, 4000), 0, rng.randint(1, 300), 0,
                                       rng.choice([None, 0, 5]), rng.random() < 0.5))
        events.append(Arrival(self.t_ns, rid, self.waiting[-1].input_len, self.waiting[-1].max_new_tokens))

    def step(self, seq: int) -> list:
        rng, events = self.rng, []
        self.t_ns += rng.randint(1, 40_000_000)
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            self._arrive(events)
        p = Pass(
            seq=seq, t_ns=self.t_ns, dur_ns=rng.randint(1, 10**6), repeat=rng.choice([1, 1, 3]),
            idle_before=rng.choice([0, 0, 7]), waiting=list(self.waiting), running=list(self.running),
            chunked=self.chunked, batch_is_full_in=rng.random() < 0.3,
            kv=KvSnapshot(rng.randint(0, 40_000), rng.randint(0, 9_000),
                          *([rng.randint(0, 99), rng.randint(0, 99)] if rng.random() < 0.2 else [])),
            req_slots_free=rng.randint(0, 12), new_token_ratio=rng.random(),
            chunked_prefill_size=rng.choice([8192, None]), candidates=[], admitted=[], chunk=None,
            new_chunked_rid=None, batch_is_full_out=rng.random() < 0.3,
            error="AssertionError: planted" if rng.random() < 0.01 else None,
        )
        self._decide(p)
        self._evolve(events)
        return [p, *events]

    def _decide(self, p: Pass) -> None:
        rng = self.rng
        if self.chunked is not None:
            size = rng.choice([None, rng.randint(1, 2048)])
            p.chunk = ChunkOutcome(self.chunked.rid, rng.choice([size, None]), size)
        for row in self.waiting[: rng.choice([0, 1, 2])]:
            admitted = rng.random() < 0.6
            p.candidates.append(Candidate(row.rid, row.prefix_len, row.input_len if admitted else 0,
                                          "CONTINUE" if admitted else "NO_TOKEN", rng.choice([None, 0, 16])))
            if admitted:
                p.admitted.append(Admitted(row.rid, row.prefix_len, row.input_len))
        if p.admitted and rng.random() < 0.2:
            p.new_chunked_rid = p.admitted[-1].rid

    def _evolve(self, events: list) -> None:
        rng = self.rng
        # admissions: mostly from the head, sometimes from further back
        for _ in range(rng.choice([0, 0, 1, 2])):
            if self.waiting:
                row = self.waiting.pop(0 if rng.random() < 0.8 else rng.randrange(len(self.waiting)))
                self.running.append(RunningReq(row.rid, row.input_len, row.output_len, row.max_new_tokens,
                                               row.ignore_eos))
        # decode: most advance one token, some none or two
        self.running = [msgspec.structs.replace(r, output_len=r.output_len + rng.choice([1, 1, 1, 1, 0, 2]))
                        for r in self.running]
        for r in [r for r in self.running if r.output_len >= r.max_new_tokens or rng.random() < 0.02]:
            self.running.remove(r)
            events.append(Finish(self.t_ns, r.rid, r.output_len, "length"))
        if self.running and rng.random() < 0.05:  # a retraction: back to the head of the queue
            r = self.running.pop(rng.randrange(len(self.running)))
            self.waiting.insert(0, WaitingReq(r.rid, r.input_len, r.output_len, r.max_new_tokens, 0, None,
                                              r.ignore_eos))
            events.append(Retract(self.t_ns, r.rid, r.output_len))
        if self.waiting and rng.random() < 0.1:  # a prefix match becomes known
            at = rng.randrange(len(self.waiting))
            self.waiting[at] = msgspec.structs.replace(self.waiting[at], prefix_len=rng.randint(1, 64))
        if len(self.waiting) > 2 and rng.random() < 0.05:  # lpm re-sorts the queue
            self.waiting.sort(key=lambda w: (w.prefix_len, w.input_len))
        self._chunk(rng)
        if rng.random() < 0.3:
            events.append(Alloc(self.t_ns, -1, "alloc_extend", rng.randint(1, 999), 5, 0, rng.random() < 0.9))

    def _chunk(self, rng: random.Random) -> None:
        if self.chunked is not None:
            done = self.chunked.prefix_len + rng.choice([0, 512, 2048])
            if done >= self.chunked.input_len:
                c = self.chunked
                self.running.append(RunningReq(c.rid, c.input_len, c.output_len, c.max_new_tokens, c.ignore_eos))
                self.chunked = None
            else:
                self.chunked = msgspec.structs.replace(self.chunked, prefix_len=done)
                if rng.random() < 0.1:  # a field other than the progress changes too
                    self.chunked = msgspec.structs.replace(self.chunked, output_len=self.chunked.output_len + 1)
        elif self.waiting and rng.random() < 0.1:
            w = self.waiting.pop(0)
            self.chunked = ChunkedReq(w.rid, w.input_len + 5000, 0, w.max_new_tokens, w.output_len, w.ignore_eos)


def generated(n: int, seed: int = 1) -> list:
    model, out = Model(seed), []
    for seq in range(n):
        out += model.step(seq)
    return out


def passes_of(records: list) -> list[Pass]:
    return [r for r in records if type(r) is Pass]


def write_v2(path: Path, records: list, *, batch: int = 7, close: bool = True, **options) -> TraceWriter:
    writer = TraceWriter(path, builders.header(), fsync_every_s=None, **options)
    for start in range(0, len(records), batch):
        writer.write_many(records[start : start + batch])
    writer.close(1) if close else writer.abandon()
    return writer


def stored_tags(path: Path) -> list[str]:
    """The tag of every pass record as stored: 'pass' (a keyframe) or 'delta'."""
    with TraceReader(path) as reader:
        data = path.read_bytes()
        return [peek_tag(data[offset : offset + 16]) for offset in reader.pass_offsets]


# --- the schema: a delta carries every field of a pass ---------------------------------------------


def test_a_delta_carries_every_field_of_a_pass() -> None:
    pass_fields, delta_fields = set(Pass.__struct_fields__), set(PassDelta.__struct_fields__)
    assert pass_fields - set(COPIED) == {"seq", "t_ns", "waiting", "running", "chunked"}
    assert set(COPIED) <= delta_fields
    assert RunningReq.__struct_fields__ == RUNNING_FIELDS  # the running rows' key names every field
    # a pass whose every field differs from the pass before rebuilds exactly
    records = generated(400, seed=3)
    differ, before = Differ(), None
    for p in passes_of(records):
        if before is not None:
            differ.keep(before)
            assert rebuild(before, differ.diff(p), 1 << 20) == p
        before = p


# --- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_pass_converted_to_v2_reads_back_field_for_field(sample: Path, tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1.trace", tmp_path / "v2.trace"
    with TraceReader(sample) as source:
        recorded = source.header.schema_version
    if recorded == 1:
        v1 = sample
    else:  # a sample the v2 recorder wrote: its v1 form first
        convert_trace(sample, v1, version=1)
    done = convert_trace(v1, v2)
    with TraceReader(v1) as whole, TraceReader(v2) as deltas, TraceReader(sample) as source:
        assert deltas.header.schema_version == 2 and whole.header.schema_version == 1
        assert msgspec.structs.replace(deltas.header, schema_version=1) == whole.header
        originals = list(whole.passes())
        assert list(deltas.passes()) == originals == list(source.passes())
        assert [r for _, r in deltas.records()][1:] == [r for _, r in whole.records()][1:]
        assert deltas.footer.counts == whole.footer.counts and deltas.closed_cleanly
        assert done.passes == len(originals) and 0 < done.keyframes < len(originals)
        assert done.dest_bytes < whole.file_size
    assert stored_tags(v2).count("delta") == len(originals) - done.keyframes


def test_convert_back_to_v1_gives_whole_passes(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "v2.trace", tmp_path / "v1.trace"
    convert_trace(FCFS_SAMPLE, v2)
    convert_trace(v2, v1, version=1)
    assert set(stored_tags(v1)) == {"pass"}
    with TraceReader(FCFS_SAMPLE) as source, TraceReader(v1) as back:
        assert back.header.schema_version == 1 and list(back.passes()) == list(source.passes())


def test_generated_passes_across_rotated_parts_read_back_and_each_part_starts_with_a_keyframe(
        tmp_path: Path) -> None:
    records = generated(1500)
    # three parts, as the recorder rotates them: pass numbers go on, each part has its own header
    cuts = [0, 520, 1100, len(records)]
    first_pass, paths = 0, []
    for part in range(3):
        chunk = records[cuts[part] : cuts[part + 1]]
        path = tmp_path / f"schedtrace-tp0-dp0-pid1.part{part:03d}.trace"
        writer = TraceWriter(path, builders.header(part=part, first_pass=first_pass), fsync_every_s=None,
                             keyframes=KeyframePolicy(every=64))
        for start in range(0, len(chunk), 11):
            writer.write_many(chunk[start : start + 11])
        writer.close(1)
        first_pass += writer.passes
        paths.append(path)
        tags = stored_tags(path)
        assert tags[0] == "pass" and "delta" in tags
        assert max(len(run) for run in "".join("k" if t == "pass" else "d" for t in tags).split("k")) < 64
    with open_traceset(paths) as traces:
        rank = traces.rank()
        assert list(rank.passes()) == passes_of(records)
        assert [r for _, r in rank.records()][1:] == records


# --- seeking -------------------------------------------------------------------------------------------


def test_every_pass_reads_the_same_by_number_in_any_order_and_from_any_offset(tmp_path: Path) -> None:
    records = generated(700, seed=5)
    path = tmp_path / "t.trace"
    write_v2(path, records, keyframes=KeyframePolicy(every=32))
    expected = passes_of(records)
    tags = stored_tags(path)
    keyframes = [n for n, tag in enumerate(tags) if tag == "pass"]
    assert len(keyframes) > 10 and tags.count("delta") > 400
    with TraceReader(path) as reader:
        assert list(offsets_from_bytes(reader.footer.keyframes)) == keyframes  # the index lists every whole pass
        order = list(range(len(expected)))
        random.Random(2).shuffle(order)
        for n in keyframes + order:
            assert reader.pass_at(n) == expected[n]
        for n in (keyframes[3], keyframes[3] + 1, keyframes[3] - 1, len(expected) - 1):
            offset = reader.pass_offsets[n]
            assert reader.record_at(offset) == expected[n]
            resumed = [r for _, r in reader.records(offset)]
            assert resumed == records[records.index(expected[n]):]
        start = keyframes[2] + 5
        assert list(reader.passes(start, start + 35)) == expected[start : start + 35]


def test_an_unclosed_v2_file_indexes_its_keyframes_by_one_walk(tmp_path: Path) -> None:
    records = generated(300, seed=6)
    path = tmp_path / "t.trace"
    write_v2(path, records, close=False, keyframes=KeyframePolicy(every=16))
    with TraceReader(path) as reader:
        assert reader.footer is None and reader.pass_count == 300
        assert [reader.pass_at(n) for n in reversed(range(300))] == passes_of(records)[::-1]


# --- damage inside a delta run ------------------------------------------------------------------------


def damaged_copy(tmp_path: Path, records: list, *, every: int = 40) -> tuple[Path, list[str], int]:
    """A v2 trace with one byte flipped in the batch holding a delta that is not a batch's first record."""
    path = tmp_path / "t.trace"
    write_v2(path, records, batch=5, keyframes=KeyframePolicy(every=every, bytes_ratio=1e9))
    tags = stored_tags(path)
    victim = next(n for n in range(every + 5, len(tags)) if tags[n] == "delta" and tags[n - 1] == "delta")
    with TraceReader(path) as reader:
        offset = reader.pass_offsets[victim]
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0x40
    path.write_bytes(bytes(data))
    return path, tags, victim


def test_a_corrupt_delta_loses_its_batch_and_the_deltas_up_to_the_next_keyframe_and_nothing_else(
        tmp_path: Path) -> None:
    records = generated(400, seed=7)
    path, tags, victim = damaged_copy(tmp_path, records)
    expected = passes_of(records)
    with TraceReader(path) as reader, pytest.raises(TraceDamagedError):
        list(reader.passes())
    with TraceReader(path, skip_damaged=True) as reader:
        (gap,) = reader.gaps
        lost = [n for n in range(len(expected)) if gap.start <= reader.pass_offsets[n] < gap.end]
        following = next(n for n in range(lost[-1] + 1, len(tags)) if tags[n] == "pass")
        assert victim in lost and gap.orphans == following - lost[-1] - 1 > 0
        assert "delta passes after it" in gap.describe()
        read = {p.seq: p for p in reader.passes()}
        assert set(read) == set(range(len(expected))) - set(range(lost[0], following))
        assert all(read[n] == expected[n] for n in read)  # everything from the next keyframe on is whole
        with pytest.raises(TraceDamagedError):
            reader.pass_at(following - 1)
        assert reader.pass_at(following) == expected[following]
        # the orphans' events still read: only the bad batch's records are lost
        events = [r for _, r in reader.records() if type(r) is not Pass][1:]
        assert len(events) == sum(type(r) is not Pass for r in records) - (gap.lost - len(lost))


def test_a_trace_cut_inside_a_delta_run_reads_every_whole_pass_before_the_cut(tmp_path: Path) -> None:
    records = generated(300, seed=8)
    path = tmp_path / "t.trace"
    write_v2(path, records, batch=3, close=False, keyframes=KeyframePolicy(every=50, bytes_ratio=1e9))
    tags = stored_tags(path)
    with TraceReader(path) as reader:
        n = next(k for k in range(60, len(tags)) if tags[k] == "delta" and tags[k + 1] == "delta")
        cut = reader.pass_offsets[n] + 4
    path.write_bytes(path.read_bytes()[:cut])
    with TraceReader(path) as reader:
        assert reader.truncated_at is not None and reader.pass_count == n
        assert list(reader.passes()) == passes_of(records)[:n]


# --- the writer's keyframes ---------------------------------------------------------------------------


class FullDisk(FileOps):
    def __init__(self) -> None:
        self.fail = False

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        if self.fail:
            raise OSError(28, "No space left on device")
        return super().pwrite(fd, data, offset)


def test_the_pass_after_a_failed_write_or_a_loss_record_is_a_keyframe(tmp_path: Path) -> None:
    records = passes_of(generated(60, seed=9))
    disk = FullDisk()
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, builders.header(), fsync_every_s=None, ops=disk,
                         keyframes=KeyframePolicy(bytes_ratio=1e9))  # keyframes only where they must be
    writer.write_many(records[:10])
    disk.fail = True
    with pytest.raises(OSError):
        writer.write_many(records[10:20])
    disk.fail = False
    renumbered = [msgspec.structs.replace(p, seq=10 + i) for i, p in enumerate(records[20:30])]
    writer.write_many(renumbered)
    writer.write_many([Loss(0, 4), *[msgspec.structs.replace(p, seq=20 + i) for i, p in enumerate(records[30:40])]])
    writer.close(1)
    tags = stored_tags(path)
    assert tags[0] == tags[10] == tags[20] == "pass" and tags[1:10] == ["delta"] * 9
    with TraceReader(path) as reader:
        assert list(reader.passes()) == records[:10] + renumbered + [
            msgspec.structs.replace(p, seq=20 + i) for i, p in enumerate(records[30:40])]


def _keyframe_runs(tmp_path: Path, queue: int, policy: KeyframePolicy | None) -> tuple[list[int], list[int]]:
    """Pass record sizes and keyframe pass numbers of 1,500 passes over a queue of ``queue`` written under ``policy``."""
    model = Model(10)
    for _ in range(queue):
        model._arrive([])
    records = passes_of([r for seq in range(1500) for r in model.step(seq)])
    path = tmp_path / f"q{queue}.trace"
    write_v2(path, records, batch=50, keyframes=policy)
    data = path.read_bytes()
    with TraceReader(path) as reader:
        offsets = list(reader.pass_offsets)
        keyframes = list(offsets_from_bytes(reader.footer.keyframes))
        assert list(reader.passes()) == records
    sizes = [frame_end(data, offset, len(data), 1 << 26) - offset for offset in offsets]
    assert keyframes[0] == 0 and max(b - a for a, b in zip(keyframes, keyframes[1:])) <= MAX_KEYFRAME_INTERVAL
    return sizes, keyframes


def test_keyframes_stay_a_bounded_share_of_the_bytes_whatever_the_queue_length(tmp_path: Path) -> None:
    shares = {}
    for queue in (40, 1000):
        sizes, keyframes = _keyframe_runs(tmp_path, queue, KeyframePolicy(walk_bytes=1 << 62))  # the ratio rule alone
        whole = sum(sizes[n] for n in keyframes)
        # the byte rule: each keyframe is followed by deltas of twice its size (the last run may be short)
        shares[queue] = (whole - sizes[keyframes[-1]]) / sum(sizes)
    assert all(share <= 1 / 3 for share in shares.values()), shares


def test_a_seek_walks_at_most_walk_bytes_of_deltas(tmp_path: Path) -> None:
    """The default policy: behind a large keyframe the deltas stop at DEFAULT_WALK_BYTES, not twice its size."""
    sizes, keyframes = _keyframe_runs(tmp_path, 1000, None)
    walked = [sum(sizes[a + 1 : b]) for a, b in zip(keyframes, keyframes[1:])]
    largest_delta = max(size for n, size in enumerate(sizes) if n not in set(keyframes))
    assert max(walked) < DEFAULT_WALK_BYTES + largest_delta
    assert min(sizes[n] for n in keyframes) * DEFAULT_BYTES_RATIO > DEFAULT_WALK_BYTES  # the ratio rule would wait longer


def test_a_large_batch_decoding_gets_keyframes_so_that_its_bytes_pay_for_the_rows_a_reader_builds(
        tmp_path: Path) -> None:
    """1,000 requests decoding: each delta of a few bytes steps 1,000 rows. The writer keeps every chain within
    the reader's budget (names.BUILT_ROWS_PER_BYTE), where the ratio and walk rules alone keep one keyframe."""
    kv = KvSnapshot(available=100, evictable=0)
    records = [builders.pass_record(seq, kv=kv, running=[RunningReq(f"{i:032x}", 100, seq, 4096) for i in range(1000)])
               for seq in range(400)]
    writer = write_v2(tmp_path / "t.trace", records, batch=50)
    with TraceReader(tmp_path / "t.trace") as reader:  # strict: a chain past the budget would raise
        assert list(reader.passes()) == records
    keyframes = list(writer.keyframes)
    assert len(keyframes) >= 4, keyframes
    unbounded = write_v2(tmp_path / "u.trace", records, batch=50, keyframes=KeyframePolicy(walk_bytes=1 << 62))
    assert len(unbounded.keyframes) >= 4  # the budget is no policy's to waive


def test_version_1_writes_every_pass_whole_and_stock_msgpack_reads_every_v2_record(tmp_path: Path) -> None:
    records = generated(200, seed=11)
    v1, v2 = tmp_path / "v1.trace", tmp_path / "v2.trace"
    write_v2(v1, records, version=1)
    write_v2(v2, records)
    assert set(stored_tags(v1)) == {"pass"} and "delta" in stored_tags(v2)
    with open(v2, "rb") as f:
        objects = list(msgpack.Unpacker(f, raw=False))
    assert {o[0] for o in objects} >= {"header", "batch", "pass", "delta", "footer", "tail"}
    with TraceReader(v1) as a, TraceReader(v2) as b:
        assert a.header.schema_version == 1 and b.header.schema_version == 2
        assert list(a.passes()) == list(b.passes()) == passes_of(records)
    with pytest.raises(ValueError):
        TraceWriter(tmp_path / "x.trace", builders.header(), framed=False, version=2)
    with pytest.raises(TypeError):
        TraceWriter(tmp_path / "y.trace", builders.header()).write_many([PassDelta(0, 0, 0, 1, 0, [], [], [], [], 0,
                                                                                   None, False, KvSnapshot(0, 0), 0,
                                                                                   0.0, None, [], [], None, None,
                                                                                   False)])


# --- convert --------------------------------------------------------------------------------------------


def test_convert_refuses_a_damaged_source_and_an_existing_destination(tmp_path: Path, capfd) -> None:
    from schedtrace.cli import PROG, run

    out = tmp_path / "out.trace"
    assert run(["convert", str(FCFS_SAMPLE), str(out)]) == 0
    said = capfd.readouterr()
    assert "-> " in said.out and "(v2, " in said.out and said.err == ""
    with TraceReader(out) as converted, TraceReader(FCFS_SAMPLE) as source:
        assert list(converted.passes()) == list(source.passes())
    before = out.read_bytes()
    assert run(["convert", str(FCFS_SAMPLE), str(out)]) == 2
    err = capfd.readouterr().err
    assert err.startswith(f"{PROG}: error: ") and "already exists" in err and err.count("\n") == 1
    assert out.read_bytes() == before
    damaged, _, _ = damaged_copy(tmp_path, generated(300, seed=14))
    dest = tmp_path / "from-damaged.trace"
    with pytest.raises(TraceDamagedError):
        convert_trace(damaged, dest)
    assert not dest.exists()


def test_convert_to_version_1_and_back_says_which_way_the_size_went(tmp_path: Path, capfd) -> None:
    from schedtrace.cli import run
    from schedtrace.cli.convert import size_change

    kimi = SAMPLES[0].parent / "hybrid-mamba-kimi.trace"  # recorded as v2
    v1, v2 = tmp_path / "v1.trace", tmp_path / "v2.trace"
    assert run(["convert", str(kimi), str(v1), "--to-version", "1"]) == 0
    said = capfd.readouterr().out
    assert "(v1, " in said and "x larger" in said and "smaller" not in said  # v1 writes every pass whole
    assert run(["convert", str(v1), str(v2), "--to-version", "2"]) == 0
    said = capfd.readouterr().out
    assert "(v2, " in said and "x smaller" in said
    with TraceReader(kimi) as source, TraceReader(v1) as one, TraceReader(v2) as two:
        assert (one.header.schema_version, two.header.schema_version) == (1, 2)
        assert list(one.passes()) == list(two.passes()) == list(source.passes())
        assert set(stored_tags(v1)) == {"pass"} and "delta" in stored_tags(v2)
    assert run(["convert", str(kimi), str(tmp_path / "v3.trace"), "--to-version", "3"]) == 2
    assert "--to-version" in capfd.readouterr().err
    assert [size_change(100, n) for n in (25, 100, 360)] == ["4.0x smaller", "the same size", "3.6x larger"]


# --- the seek budget (names.SEEK_BYTES) ---------------------------------------------------------------------------


def queue_of(rows: int, tag: str) -> list[WaitingReq]:
    return [WaitingReq(f"{tag}-{i:06d}-0123456789abcdef", 100, 0, 16, 0) for i in range(rows)]  # ~45 B, as recorded


def pass_sizes(path: Path) -> list[tuple[str, int]]:
    """(tag, bytes) of every pass record as stored."""
    with TraceReader(path) as reader:
        data, end = reader._mm, reader.data_end  # noqa: SLF001
        return [(peek_tag(data[o : o + 16]), frame_end(data, o, end, 1 << 30) - o) for o in reader.pass_offsets]


@pytest.mark.parametrize("version", [1, 2])
def test_a_pass_too_large_to_write_whole_is_a_loss_and_the_passes_after_it_are_numbered_on(
        tmp_path: Path, version: int) -> None:
    huge = builders.pass_record(1, waiting=queue_of(SEEK_BYTES // 30, "w"))  # past SEEK_BYTES whole
    later = builders.pass_record(2, waiting=queue_of(3, "w"))
    records = [builders.pass_record(0), Arrival(1, "a", 10, 5), huge, Alloc(2, 1, "alloc", 8, 100, 0, False),
               Arrival(3, "b", 10, 5), later, Alloc(4, 2, "alloc", 8, 100, 0, True)]
    path = tmp_path / "t.trace"
    writer = TraceWriter(path, builders.header(), version=version)
    writer.write_many(records)
    assert writer.left_out == [huge, records[3]]  # the pass and its event
    writer.close(9)
    with TraceReader(path) as reader:
        assert reader.closed_cleanly and reader.pass_count == 2
        got = [r for _, r in reader.records()]
        assert [type(r).__name__ for r in got[1:]] == ["Pass", "Arrival", "Loss", "Arrival", "Pass", "Alloc"]
        loss = got[3]
        assert (loss.reason, loss.count) == (LOSS_PASS_TOO_LARGE, 2)
        assert got[5].seq == 1 and got[5].waiting == later.waiting  # numbered on from the file's passes
        assert got[6].pass_seq == 1 and got[6].ok
    assert all(size <= SEEK_BYTES for _, size in pass_sizes(path))


def test_the_writer_writes_a_keyframe_before_a_chain_passes_the_seek_budget(tmp_path: Path) -> None:
    """Every pass's queue is new (a delta of fresh rows some 45 KB each): the ratio and walk rules would let deltas
    pile up behind a large keyframe; the seek budget cuts each chain at SEEK_BYTES of pass records."""
    passes = [builders.pass_record(seq, waiting=queue_of(1000 + seq, f"q{seq}")) for seq in range(60)]
    path = tmp_path / "t.trace"
    policy = KeyframePolicy(bytes_ratio=1e9, walk_bytes=1 << 40)  # only the seek budget and the interval
    writer = TraceWriter(path, builders.header(), keyframes=policy)
    writer.write_many(passes)
    writer.close(1)
    sizes = pass_sizes(path)
    chains, chain = [], 0
    for tag, size in sizes:
        if tag == "pass" and chain:
            chains.append(chain)
            chain = 0
        chain += size
    chains.append(chain)
    assert len(chains) > 1 and max(chains) <= SEEK_BYTES  # cut, and every cut within the budget
    assert sum(tag == "delta" for tag, _ in sizes) > len(chains)  # deltas still written between
    with TraceReader(path) as reader:
        assert list(reader.passes()) == passes
        assert reader.pass_at(59) == passes[59]
