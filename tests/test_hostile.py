"""Hostile traces (issue 23): crafted files with valid checksums, batches swapped or copied, schema failures.

Every family of ``bench/bench_hostile.py`` runs a few seeded cases through
its ``read_contract`` (nothing but the error tree escapes, strict or reading
on past damage or converting; every number a file claims is bounded by its
size; every record written is read back as written or lies in a reported
gap). The rest pins down what each family must come to: the gap it is, the
passes it costs, and that the CLI prints it as a hole. No timings: the bench
prints those. ``HOSTILE_CASES=50`` runs more.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from bench.bench_hostile import (
    CONVERT_BELOW,
    CRAFTED,
    FAMILIES,
    Crafter,
    a_delta,
    a_pass,
    big_pass,
    cases,
    claimed_loss,
    long_chain,
    read_contract,
    wide_chain,
)
from schedtrace.cli import run
from schedtrace.tracer.contract.convert import convert_trace
from schedtrace.tracer.contract.errors import TraceDamagedError, TraceFormatError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import BUILT_ROWS_PER_BYTE, SEEK_BYTES
from schedtrace.tracer.contract.reader import UNKNOWN_TAGS
from schedtrace.tracer.contract.schema import Arrival, Pass

CASES = int(os.environ.get("HOSTILE_CASES", "15"))
BIG = 1 << 64


@pytest.mark.parametrize("family", FAMILIES)
def test_every_hostile_family_keeps_the_reading_contract(family: str, tmp_path: Path) -> None:
    # damage to a real trace varies more; a long chain is one shape, and reading each of its passes is the cost
    count = max(CASES * 2, 30) if family not in CRAFTED else 3 if family == "long-chain" else CASES
    for name, crafted in cases(family, count, tmp_path):
        try:
            read_contract(crafted)
        except AssertionError as failure:
            raise AssertionError(f"{name}: {failure}") from failure
        crafted.path.unlink()


def test_doubling_deltas_stop_at_the_first_one_and_lose_only_their_passes(tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0, waiting=2)])
    c.batch([a_delta(1, waiting_runs=[0, 2, 0, 2]), a_delta(2, waiting_runs=[0, 4, 0, 4])])
    c.batch([a_pass(3, waiting=1), Arrival(1, "a", 1, 1)])
    path = c.done(close=True).path
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="grows past its 2 rows"):
        list(reader.records())
    with TraceReader(path, skip_damaged=True) as reader:
        seqs = [p.seq for p in reader.passes()]
        assert seqs == [0, 3] and reader.pass_count == 4
        (gap,) = reader.gaps
        assert gap.lost == 1 and gap.orphans == 1  # the delta, and the one after it that needs it


def test_a_claimed_loss_past_what_the_bytes_hold_is_a_gap_of_unknown_count(tmp_path: Path) -> None:
    for case in range(6):
        path = claimed_loss(tmp_path / f"t{case}.trace", random.Random(case)).path
        with TraceReader(path, skip_damaged=True) as reader:
            assert [p.seq for _, p in reader.records() if isinstance(p, Pass)] == [0]
            assert reader.pass_count == 1  # pass 0; the claimed ones are not indexed
            assert sum(gap.end - gap.start for gap in reader.gaps) > 0
            assert all(gap.lost is None or gap.lost <= gap.end - gap.start for gap in reader.gaps)
        assert run(["info", str(path)]) == 0  # listed as holes, no traceback


def test_a_rebuilt_number_past_what_a_record_holds_is_refused_not_an_overflow(tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0, running=2, t_ns=5)])
    c.batch([a_delta(1, dt_ns=BIG - 1), a_pass(2)])
    path = c.done(close=True).path
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="t_ns past what a record can hold"):
        list(reader.records())
    with pytest.raises(TraceFormatError, match="past what a record can hold"):
        convert_trace(path, tmp_path / "v1.trace", version=1)
    assert not (tmp_path / "v1.trace").exists()
    assert run(["convert", str(path), str(tmp_path / "v1b.trace"), "--to-version", "1"]) == 2
    c = Crafter(tmp_path / "step.trace")
    c.batch([a_pass(0, running=2)])
    c.batch([a_delta(1, running_runs=[0, 2], running_step=BIG - 1), a_pass(2)])
    with TraceReader(c.done().path, skip_damaged=True) as reader:
        assert [p.seq for p in reader.passes()] == [0, 2]
        assert [(g.lost, g.first_bad) for g in reader.gaps] == [(1, reader.pass_offsets[1])]
        with pytest.raises(TraceDamagedError, match="output_len past what a record can hold"):
            reader.pass_at(1)


@pytest.mark.parametrize("bad", [
    b"\x95\xa6arrive\x01\xa2\xff\xfe\x01\x01",  # a rid that is not UTF-8
    b"\x92\xa4idle\xc0",  # a count that is nil
    b"\x05",  # not a tagged record at all
])
def test_a_record_that_fails_the_schema_is_a_gap_of_one_record(bad: bytes, tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0), Arrival(1, "a", 1, 1)])
    c.batch([Arrival(2, "b", 1, 1), bad, a_pass(1)])
    c.batch([a_pass(2)])
    crafted = c.done(close=True)
    at = next(o for o in sorted(crafted.records) if o > min(o for o, r in crafted.records.items()
                                                             if r == Arrival(2, "b", 1, 1)))
    with TraceReader(crafted.path) as reader, pytest.raises(TraceFormatError):
        list(reader.records())
    with TraceReader(crafted.path, skip_damaged=True) as reader:
        read = dict(reader.records())
        assert all(read[o] == r for o, r in crafted.records.items())
        (gap,) = reader.gaps
        assert gap.lost == 1 and gap.end == at and gap.first_bad == gap.start and not reader.closed_cleanly
        assert [p.seq for p in reader.passes()] == [0, 1, 2]


def test_a_pass_that_fails_the_schema_is_lost_with_the_deltas_that_need_it(tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0), a_delta(1)])
    c.batch([b"\x93\xa4pass\x02\xa1x", a_delta(3), a_delta(4), a_pass(5)])
    with TraceReader(c.done(close=True).path, skip_damaged=True) as reader:
        assert [p.seq for p in reader.passes()] == [0, 1, 5]
        assert [p.seq for _, p in reader.records() if isinstance(p, Pass)] == [0, 1, 5]
        (gap,) = reader.gaps
        assert (gap.lost, gap.orphans) == (1, 2)


def test_a_cold_pass_at_far_into_a_long_chain_is_the_pass_read_in_order(tmp_path: Path) -> None:
    """``pass_at`` builds only the pass asked for (delta.Walk); it must equal every delta applied in turn."""
    path = long_chain(tmp_path / "t.trace", random.Random(3), rows=40).path  # within the rows its bytes pay for
    with TraceReader(path) as reader:
        in_order = [p for _, p in reader.records() if isinstance(p, Pass)]
    assert len(in_order) == 1024 and in_order[-1].running[0].output_len == 1 + 1023
    for n in random.Random(1).sample(range(1024), 12) + [1023]:
        with TraceReader(path) as reader:
            assert reader.pass_at(n) == in_order[n]


def test_deltas_that_step_more_rows_than_their_bytes_pay_for_are_refused_and_their_passes_counted(
        tmp_path: Path) -> None:
    """A long chain of 2,000 rows: each 30-byte delta steps them all. The rows a read builds are bounded by the
    file's size (names.BUILT_ROWS_PER_BYTE); the passes past the budget are a gap's, up to the next keyframe."""
    crafted = long_chain(tmp_path / "t.trace", random.Random(3), rows=2000)
    size = crafted.path.stat().st_size
    with TraceReader(crafted.path) as reader, pytest.raises(TraceFormatError, match="rows since its keyframe"):
        list(reader.records())
    with TraceReader(crafted.path, skip_damaged=True) as reader:
        passes = list(reader.passes())
        (gap,) = reader.gaps
        assert reader.pass_count == 1024
        assert len(passes) + gap.lost + gap.orphans == 1024 and gap.orphans > 900
        built = sum(len(p.running) for p in passes[1:])
        assert built <= BUILT_ROWS_PER_BYTE * size < 1023 * 2000
        assert passes[-1].running[0].output_len == len(passes)  # each pass read is the one written
    with TraceReader(crafted.path, skip_damaged=True) as reader:
        with pytest.raises(TraceDamagedError):
            reader.pass_at(1000)  # cold, by the walk: the same budget
        assert reader.pass_at(len(passes) - 1) == passes[-1]


@pytest.mark.parametrize("case", range(4))  # v1 and v2, closed or not
def test_a_pass_record_past_the_seek_budget_is_a_gap_of_one_record_never_decoded(tmp_path: Path, case: int) -> None:
    path = big_pass(tmp_path / "t.trace", random.Random(case)).path
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="more than a pass may hold") as caught:
        list(reader.records())
    assert caught.value.offset > 0
    with TraceReader(path, skip_damaged=True) as reader:
        passes = list(reader.passes())
        (gap,) = reader.gaps
        assert [p.seq for p in passes] == [0, *range(2, reader.pass_count)]  # the passes after it stand alone
        assert (gap.lost, gap.orphans) == (1, 0) and gap.end - gap.start > SEEK_BYTES
        assert all(len(p.running) <= 2 for p in passes)


def test_deltas_past_the_seek_budget_lose_the_passes_after_them_to_the_next_keyframe(tmp_path: Path) -> None:
    """Each delta holds thousands of fresh rows, within what its bytes pay for: a seek to the last of them would
    decode every one. The delta that takes the chain past SEEK_BYTES is damaged; the rest wait for a keyframe."""
    path = wide_chain(tmp_path / "t.trace", random.Random(2)).path
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="makes a seek decode"):
        reader.pass_at(reader.pass_count - 2)
    with TraceReader(path, skip_damaged=True) as reader:
        passes = list(reader.passes())
        (gap,) = reader.gaps
        assert len(passes) + gap.lost + gap.orphans == reader.pass_count
        assert passes[-1].seq == reader.pass_count - 1 and passes[-1].running == a_pass(0, running=2).running
    with TraceReader(path, skip_damaged=True) as reader:  # cold, by the walk: the same budget
        with pytest.raises(TraceDamagedError):
            reader.pass_at(reader.pass_count - 2)
        assert reader.pass_at(reader.pass_count - 1) == passes[-1]


def test_a_swapped_pair_of_batches_costs_only_what_the_two_gaps_hold(tmp_path: Path) -> None:
    """The footer still checks out but its index is stale: read past damage, the file is indexed by a walk."""
    for name, crafted in cases("swap", 12, tmp_path):
        with TraceReader(crafted.path, skip_damaged=True) as reader:
            read = dict(reader.records())
            gaps = reader.gaps
            assert len(gaps) == 2, name
            held = sum(1 for o in crafted.records if any(g.start <= o < g.end for g in gaps))
            orphans = sum(g.orphans for g in gaps)
            assert len(read) - 1 == len(crafted.records) - held - orphans, name
            assert sum(g.lost for g in gaps) == held, name


@pytest.mark.parametrize("family", list(CRAFTED))
def test_the_cli_prints_a_hostile_file_as_holes_or_one_line_never_a_traceback(family: str, tmp_path: Path,
                                                                            capsys) -> None:
    for name, crafted in cases(family, 1 if family == "long-chain" else 3, tmp_path):
        path = str(crafted.path)
        assert run(["info", path]) in (0, 2), name  # anything outside the error tree would raise here
        if crafted.path.stat().st_size < CONVERT_BELOW:  # a long chain's v1 copy is many times its size
            assert run(["convert", path, str(tmp_path / f"{name}.v1"), "--to-version", "1"]) in (0, 2), name
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.splitlines()) <= 1, f"{name}: {err}"


def test_a_run_of_bad_records_is_one_gap_and_unknown_tags_are_counted_in_bounded_memory(tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0)])
    c.batch([b"\x00"] * 1000)  # a thousand records that are not tagged arrays: one gap, not a thousand
    c.batch([b"\x91\xa5" + f"{i:05d}".encode() for i in range(500)])  # five hundred unknown tags
    c.batch([a_pass(1)])
    with TraceReader(c.done().path, skip_damaged=True) as reader:
        assert [p.seq for _, p in reader.records() if isinstance(p, Pass)] == [0, 1]
        (gap,) = reader.gaps
        assert (gap.lost, gap.end - gap.start) == (1000, 1000)
        assert len(reader.unknown_records) == UNKNOWN_TAGS + 1 and sum(reader.unknown_records.values()) == 500


def test_a_marker_claiming_more_than_any_honest_batch_is_no_marker() -> None:
    """A crafted batch length past the writer's bound is neither read nor hashed (framing.MAX_BATCH_BYTES)."""
    from schedtrace.tracer.contract.framing import MARKER_SIZE, MAX_BATCH_BYTES, marker_bytes, read_marker

    def claiming(n_bytes: int) -> bytes:
        marker = bytearray(marker_bytes(0, 1, b"\x90", 0))
        marker[22:26] = n_bytes.to_bytes(4, "big")  # the uint32 batch length (framing._LAYOUT)
        return bytes(marker)

    assert read_marker(claiming(1), 0, MARKER_SIZE).n_bytes == 1
    assert read_marker(claiming(MAX_BATCH_BYTES), 0, MARKER_SIZE).n_bytes == MAX_BATCH_BYTES
    assert read_marker(claiming(MAX_BATCH_BYTES + 1), 0, MARKER_SIZE) is None


def test_runs_of_one_byte_objects_are_gaps_counted_to_the_byte_and_split_by_good_records(tmp_path: Path) -> None:
    """A run of 1-byte objects is stepped over as one (frames.spans); its gap still counts every one of them."""
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0)])
    c.batch([b"\x00"] * 700 + [b"\xc0", b"\x90"] + [b"\x7f"] * 298)  # a thousand 1-byte objects, then more
    c.batch([b"\x01"] * 50 + [Arrival(1, "a", 1, 1)] + [b"\xe0", b"\xcc\x05"] + [b"\xc3"] * 9)
    c.batch([a_pass(1)])
    path = c.done().path
    with TraceReader(path, skip_damaged=True) as reader:
        read = [r for _, r in reader.records()]
        assert [p.seq for p in read if isinstance(p, Pass)] == [0, 1] and Arrival(1, "a", 1, 1) in read
        assert [(g.lost, g.end - g.start) for g in reader.gaps] == [(1000, 1000), (50, 50), (11, 12)]  # a marker between
    with TraceReader(path) as reader, pytest.raises(TraceFormatError, match="expected a tagged record array"):
        list(reader.records())


def test_a_run_of_one_byte_objects_before_bytes_that_are_not_msgpack_is_counted_too(tmp_path: Path) -> None:
    c = Crafter(tmp_path / "t.trace")
    c.batch([a_pass(0)])
    c.batch([b"\x00"] * 40 + [b"\xc1\xc1"])
    c.batch([a_pass(1)])
    with TraceReader(c.done().path, skip_damaged=True) as reader:
        assert [p.seq for _, p in reader.records() if isinstance(p, Pass)] == [0, 1]
        assert [(g.start < g.end, g.lost) for g in reader.gaps][0] == (True, 40)


def test_the_reading_limits_are_named_once_in_names_py() -> None:
    from schedtrace.tracer.contract import codec, framing, keyframes, names, pass_chain, pass_index, reader, verify

    for module, limit in [(codec, "MAX_RECORD_BYTES"), (framing, "MAX_BATCH_BYTES"), (framing, "MIN_RECORD_BYTES"),
                          (framing, "SPLIT_BYTES"), (pass_index, "MIN_PASS_BYTES"), (pass_chain, "MIN_ROW_BYTES"),
                          (keyframes, "MAX_KEYFRAME_INTERVAL"), (reader, "UNKNOWN_TAGS"), (verify, "HASH_BUDGET"),
                          (reader, "SEEK_BYTES"), (pass_chain, "SEEK_BYTES"), (keyframes, "SEEK_BYTES")]:
        assert getattr(module, limit) is getattr(names, limit), limit


def test_the_gaps_holding_passes_are_the_same_looked_up_from_the_gaps_or_from_the_passes() -> None:
    """pass_chain.gaps_holding walks the fewer of the two (a file can hold a gap every 4 bytes); either way it
    must name every gap that holds a pass, with its first pass and the one after its last."""
    from array import array

    from schedtrace.tracer.contract.framing import Gap
    from schedtrace.tracer.contract.pass_chain import gaps_holding

    def every_pair(gaps: list[Gap], offsets: array) -> list[tuple[int, int, int]]:
        out = []
        for i, gap in enumerate(gaps):
            inside = [n for n, o in enumerate(offsets) if gap.start <= o < max(gap.end, gap.start + 1)]
            if inside:
                out.append((i, inside[0], inside[-1] + 1))
        return out

    rng = random.Random(5)
    walks = set()
    for _ in range(200):
        bounds = sorted(rng.sample(range(1, 2000), rng.randrange(2, 60)))
        gaps = [Gap(start=a, end=a + rng.choice([0, 1, 5, b - a]), lost=1, reason="x")
                for a, b in zip(bounds[::2], bounds[1::2])]  # disjoint, some of no bytes
        offsets = array("Q", sorted(rng.sample(range(2000), rng.randrange(0, 120))))
        for some in (offsets, offsets[: len(gaps) // 2]):  # more passes than gaps, then fewer
            walks.add(len(gaps) <= len(some))
            assert gaps_holding(gaps, some) == every_pair(gaps, some)
    assert walks == {True, False}
