"""Rank agreement: ranks aligned on the pass clock, differences caught where they are, DP side by side."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from schedtrace.cli import run
from schedtrace.tracer.analysis import digest
from schedtrace.tracer.analysis.ranks import IDENTITY_FIELDS, SHARED_FIELDS, compare_ranks
from schedtrace.tracer.contract.report import RanksReport
from schedtrace.testing import builders
from schedtrace.tracer.contract.format import write_trace
from schedtrace.tracer.contract.schema import (Admitted, Arrival, Candidate, Clock, Header, Idle, KvSnapshot, Loss,
                                               Pass, RunningReq, WaitingReq)
from schedtrace.tracer.contract.traceset import open_traceset

MS = 1_000_000


@dataclass
class Step:
    """One entry of what every rank of a group saw: idle passes, or a pass (its repeats folded)."""

    idle: int = 0
    record: Pass | None = None


def script(n: int = 30, queue: int = 2) -> list[Step]:
    """Idle passes, then a pass, ``n`` times; every 4th pass admits its head, every 5th folds 3 repeats."""
    steps = []
    for i in range(n):
        waiting = [WaitingReq(f"r{i}-{j}", 300 + j, 0, 16, 0) for j in range(queue)]
        admits = i % 4 == 0
        p = builders.pass_record(
            0, waiting=waiting, running=[RunningReq(f"run{k}", 50, 3, 16) for k in range(i % 3)],
            kv=KvSnapshot(available=20_000 - 10 * i, evictable=i), req_slots_free=4,
            candidates=[Candidate(waiting[0].rid, 0, 300 if admits else 0, "CONTINUE" if admits else "NO_TOKEN")],
            admitted=[Admitted(waiting[0].rid, 0, 300)] if admits else [],
            repeat=3 if i % 5 == 4 and not admits else 1,
        )
        steps += [Step(idle=2), Step(record=p)]
    return steps


def write_rank(folder: Path, steps: list[Step], *, tp: int, split_folds: bool = False, jitter_ns: int = 0,
               run_id: str = "run-x", lose_after: int | None = None, **header: object) -> Path:
    """The trace rank ``tp`` writes for ``steps``: its own timing, and, with ``split_folds``, each folded
    pass written as two records (the recorder's fold timer split it) and each idle count as two records."""
    records: list = []
    seq, t_ns = 0, 0
    for index, step in enumerate(steps):
        t_ns += MS + jitter_ns
        if step.record is None:
            counts = [1, step.idle - 1] if split_folds and step.idle > 1 else [step.idle]
            records += [Idle(t_ns, c) for c in counts]
            continue
        repeats = [1, step.record.repeat - 1] if split_folds and step.record.repeat > 1 else [step.record.repeat]
        for r in repeats:
            records.append(msgspec.structs.replace(step.record, seq=seq, t_ns=t_ns, dur_ns=1000 + tp, repeat=r))
            seq += 1
        records.append(Arrival(t_ns + 1, f"a{index}", 10, 5))
        if lose_after is not None and index == lose_after:
            records.append(Loss(t_ns + 2, 40))
            break
    path = folder / f"schedtrace-tp{tp}-dp0-pid{100 + tp}.part000.trace"
    fields = {"run_id": run_id, "tp_rank": tp, "tp_size": 4, "pid": 100 + tp, "start_wall_ns": 10**18 + tp} | header
    write_trace(path, builders.header(**fields), records)
    return path


def altered(steps: list[Step], index: int, **fields: object) -> list[Step]:
    out = list(steps)
    out[index] = Step(record=msgspec.structs.replace(steps[index].record, **fields))
    return out


def compare(folder: Path, **options: object) -> RanksReport:
    with open_traceset([folder]) as traces:
        run_ = traces.run()
        return compare_ranks(run_.ranks, run=run_.label, **options)


def tp_set(folder: Path, per_rank: dict[int, list[Step]] | None = None, ranks: int = 4) -> Path:
    """``ranks`` ranks of one TP run; tp1 splits folds, tp3 runs on another clock."""
    folder.mkdir(exist_ok=True)
    base = script()
    for tp in range(ranks):
        write_rank(folder, (per_rank or {}).get(tp, base), tp=tp, split_folds=tp == 1, jitter_ns=tp == 3 and 7919)
    return folder


def test_every_pass_and_header_field_is_compared_or_named_as_not() -> None:
    """A field added to the schema fails here until it is placed: compared across ranks, or not."""
    placed = digest.TIMING_FIELDS + digest.INPUT_FIELDS + digest.OUTPUT_FIELDS
    assert sorted(placed) == sorted(Pass.__struct_fields__)
    assert sorted(IDENTITY_FIELDS + SHARED_FIELDS) == sorted(Header.__struct_fields__)


def test_ranks_that_decided_the_same_agree(tmp_path: Path) -> None:
    """Different timing, folds split differently, idle counts split: still the same passes."""
    report = compare(tp_set(tmp_path))
    assert report.verdict == "agree" and report.mode == "tp"
    assert report.first is None and report.later == [] and report.header_diffs == []
    clocks = {r.rank: r.clock for r in report.ranks}
    assert len(set(clocks.values())) == 1
    assert report.groups[0].compared_until == clocks["tp0"]
    records = {r.rank: r.pass_records for r in report.ranks}
    assert records["tp1"] > records["tp0"]  # tp1 wrote more records for the same passes


def test_an_altered_pass_is_caught_at_that_pass_with_the_field_named(tmp_path: Path) -> None:
    base = script()
    index = 27  # the pass of script step 27 (pass seq 13 on ranks that fold as recorded)
    report = compare(tp_set(tmp_path, {2: altered(base, index, kv=KvSnapshot(available=5, evictable=13))}))
    assert report.verdict == "desync"
    first = report.first
    assert first is not None and report.later == []
    assert first.passes["tp0"] == first.passes["tp2"] == first.passes["tp3"] == 13
    assert first.passes["tp1"] == 14  # tp1 split an earlier fold: the same pass has another seq there
    assert first.kind == "inputs" and first.odd == ["tp2"] and first.reference == ["tp0", "tp1", "tp3"]
    assert [(f.field, f.side) for f in first.fields] == [("kv.available", "input")]
    values = {tuple(v.ranks): v.value for v in first.fields[0].values}
    assert values == {("tp0", "tp1", "tp3"): 20_000 - 130, ("tp2",): 5}
    assert first.clock == sum(s.idle + (s.record.repeat if s.record else 0) for s in base[:index])


def test_on_point_sees_every_differing_pass_of_a_run_the_report_merges(tmp_path: Path) -> None:
    """The TUI marks every desync pass: a run of one difference is one RankDiff, but each of its points is seen."""
    base = script()
    seen = []
    odd = altered(altered(base, 27, kv=KvSnapshot(available=5, evictable=13)), 29,
                  kv=KvSnapshot(available=5, evictable=14))  # only kv.available differs, twice
    report = compare(tp_set(tmp_path, {2: odd}), on_point=seen.append)
    assert report.first is not None and report.later == [] and report.first.points == len(seen) == 3
    assert [d.passes["tp2"] for d in seen] == [13, 14, 14]  # pass 14 is folded; tp1 splits its fold: two points
    assert all(d.clock == d.until and d.points == 1 and d.odd == ["tp2"] for d in seen)
    assert seen[0].clock == report.first.clock and seen[-1].clock == report.first.until


def test_same_inputs_another_decision_is_a_scheduler_nondeterminism(tmp_path: Path) -> None:
    base = script()
    other = altered(base, 9, admitted=[], candidates=[Candidate("r4-0", 0, 0, "NO_TOKEN")])  # pass 4 admitted r4-0
    report = compare(tp_set(tmp_path, {3: other}))
    first = report.first
    assert first is not None and first.kind == "decision" and first.odd == ["tp3"]
    assert first.fields[0].field == "decision.admitted" and first.fields[0].side == "output"
    assert {tuple(v.ranks): v.value for v in first.fields[0].values} == {
        ("tp0", "tp1", "tp2"): [["r4-0", 300]], ("tp3",): []}  # short lists are shown whole


def test_a_rank_idle_where_the_others_had_a_pass(tmp_path: Path) -> None:
    base = script()
    idle_instead = [*base[:5], Step(idle=base[5].record.repeat), *base[6:]]
    report = compare(tp_set(tmp_path, {0: idle_instead}))
    first = report.first
    assert first is not None and first.kind == "inputs" and first.odd == ["tp0"]
    assert first.passes["tp0"] is None
    assert first.fields[0].field == "idle"
    assert report.later == []  # the clocks stay aligned: later passes agree again


def test_later_differences_merge_runs_and_are_bounded(tmp_path: Path) -> None:
    base = script()
    odd = base
    for index in (21, 23, 25, 41, 51):  # three passes in a row (idle passes between), then two apart
        odd = altered(odd, index, req_slots_free=0)
    report = compare(tp_set(tmp_path, {1: odd}), max_listed=1)
    first = report.first
    assert first is not None and first.points == 3  # one run: no pass where the ranks agreed in between
    assert first.fields[0].field == "req_slots_free" and first.until > first.clock
    assert report.later_total == 2 and len(report.later) == 1
    assert report.groups[0].differing_points == 5


def test_a_rank_that_lost_records_is_compared_up_to_the_loss(tmp_path: Path) -> None:
    base = script()
    for tp in range(3):
        write_rank(tmp_path, base, tp=tp, lose_after=31 if tp == 2 else None)
    report = compare(tmp_path)
    assert report.verdict == "agree"
    facts = {r.rank: r for r in report.ranks}
    assert facts["tp2"].lost == 40 and facts["tp2"].lost_at is not None
    assert any(note.startswith("tp2 lost 40 record(s)") for note in report.notes)


def test_headers_that_differ_are_a_desync(tmp_path: Path) -> None:
    base = script()
    for tp in range(2):
        write_rank(tmp_path, base, tp=tp, max_req_slots=13 + tp)
    report = compare(tmp_path)
    assert report.verdict == "desync" and report.first is None
    assert [(f.field, [v.value for v in f.values]) for f in report.header_diffs] == [("max_req_slots", [13, 14])]


def dp_set(folder: Path, extra_idle: int = 0) -> Path:
    """DP attention, 2 DP ranks of 2 attention-TP ranks each; attn-dp 1 has the longer queue and is idle early."""
    for tp in range(4):
        dp = tp // 2
        steps = script(queue=1 + 3 * dp)
        if dp == 1:
            steps = [Step(idle=s.record.repeat) if i < 24 and s.record else s for i, s in enumerate(steps)]
        steps.append(Step(idle=2 + (extra_idle if dp == 1 else 0)))
        write_rank(folder, steps, tp=tp, attn_dp_rank=dp, attn_dp_size=2, attn_tp_rank=tp % 2, attn_tp_size=2)
    return folder


def test_dp_attention_ranks_are_shown_side_by_side(tmp_path: Path) -> None:
    report = compare(dp_set(tmp_path), rows=4)
    assert report.mode == "dp-attention" and report.verdict == "agree"
    assert [(g.group, g.ranks, g.agree) for g in report.groups] == [("attn-dp 0", ["tp0", "tp1"], True),
                                                                    ("attn-dp 1", ["tp2", "tp3"], True)]
    dp = report.dp
    assert dp is not None and dp.ranks == ["tp0", "tp2"]
    assert dp.lockstep is not None and dp.lockstep.exact and not dp.lockstep.broken and dp.lockstep.skew == 0
    first, last = dp.rows[0], dp.rows[-1]
    assert first.idle_ranks == ["tp2"]  # attn-dp 1 had nothing waiting at first
    assert [c.waiting_mean for c in last.cells] == [1.0, 4.0]
    assert sum(c.passes for row in dp.rows for c in row.cells[:1]) == report.ranks[0].clock
    assert last.waiting_imbalance == pytest.approx(4.0 / 2.5, abs=0.01)
    assert dp.not_in_trace


def test_dp_attention_clocks_that_end_apart_break_the_lockstep(tmp_path: Path) -> None:
    report = compare(dp_set(tmp_path, extra_idle=5))
    assert report.verdict == "desync" and report.first is None
    lock = report.dp.lockstep
    assert lock.broken and lock.skew == 5


# --- the command -------------------------------------------------------------------------


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agree = tp_set(tmp_path / "agree")
    odd = tp_set(tmp_path / "odd", {2: altered(script(), 27, req_slots_free=1)})
    assert run(["ranks", str(agree)]) == 0
    assert "agree on every pass" in capsys.readouterr().out
    assert run(["ranks", str(odd)]) == 1
    out = capsys.readouterr().out
    assert "ranks differ" in out and "req_slots_free" in out
    assert run(["ranks", str(agree / "schedtrace-tp0-dp0-pid100.part000.trace")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "has one rank (tp0)" in err[0]
    assert run(["ranks", str(tmp_path / "nothing-here")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_json_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tp_set(tmp_path, {2: altered(script(), 27, req_slots_free=1)})
    outputs = []
    for name in ("a.json", "b.json"):
        assert run(["ranks", str(folder), "--json", str(tmp_path / name)]) == 1
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    capsys.readouterr()
    assert run(["ranks", str(folder), "--json", "-"]) == 1
    printed = capsys.readouterr().out
    assert printed.encode() == outputs[0]
    assert json.loads(printed)["first"]["fields"][0]["field"] == "req_slots_free"


def test_ranks_must_start_at_their_first_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A later part's place on the pass clock is unknown: comparing from it would misalign the ranks."""
    tp_set(tmp_path, ranks=2)
    late = tmp_path / "schedtrace-tp1-dp0-pid101.part000.trace"
    with open_traceset([late]) as traces:
        header = msgspec.structs.replace(traces.rank().header, part=1)
        records = [r for _, r in traces.rank().records()][1:]
    write_trace(tmp_path / "schedtrace-tp1-dp0-pid101.part001.trace", header, records)
    late.unlink()
    assert run(["ranks", str(tmp_path)]) == 2
    assert "tp1 starts at part 1: ranks compares every rank from its part 0" in capsys.readouterr().err


def test_clock_records_place_a_dp_rank_on_the_shared_timeline(tmp_path: Path) -> None:
    """A rank whose clock record says its wall clock runs 40 ms ahead has its passes 40 ms later."""
    for dp in range(2):
        records: list = [Clock(0, 10**18 + 40 * MS)] if dp else []
        records += [builders.pass_record(s, t_ns=(s + 1) * MS, waiting=[WaitingReq("r", 1, 0, 1, 0)])
                    for s in range(10)]
        header = builders.header(run_id="clocked", tp_rank=dp, tp_size=2, attn_dp_rank=dp, attn_dp_size=2,
                                 pid=dp + 1, start_wall_ns=10**18)
        write_trace(tmp_path / f"dp{dp}.trace", header, records)
    report = compare(tmp_path, rows=5)
    rows = report.dp.rows
    assert report.dp.bucket_ns == 5 * MS  # 10 ms of passes by the headers, over 5 rows, rounded up
    assert [r.cells[0].passes for r in rows] == [4, 5, 1] + [0] * 8
    assert [r.cells[1].passes for r in rows] == [0] * 8 + [4, 5, 1]  # 40 ms later: the timeline grew
