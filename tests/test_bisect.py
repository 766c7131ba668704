"""Stall bisect on reproduction traces, with the real sglang code (PassDriver)."""

from __future__ import annotations

import json

import pytest

from schedtrace.replay.bisect import fix_subsets, run_bisect
from schedtrace.tracer.contract.report import dump_bisect
from schedtrace.cli import main

from loop_traces import (
    FIRST_RUNNING_FINISH,
    LATCH_PASSES,
    latch_reproduction,
    one_chunk_reproduction,
)


def test_subsets_smallest_first_then_name_order():
    subsets = fix_subsets(["one-chunk", "latch", "chunk-cap", "aiter"])
    assert len(subsets) == 15
    assert subsets[:5] == [("aiter",), ("chunk-cap",), ("latch",), ("one-chunk",), ("aiter", "chunk-cap")]
    assert subsets[-1] == ("aiter", "chunk-cap", "latch", "one-chunk")


def test_latch_bisect_names_latch_and_the_onset(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    report = run_bisect(trace)
    assert report.fixes == ["aiter", "chunk-cap", "latch", "one-chunk"]

    (opened,) = report.open_loop
    assert opened.stall.start_pass == 0 and opened.stall.passes == LATCH_PASSES
    assert opened.stall.head_rid == "queued"
    assert opened.first_divergence.pass_ == 0
    assert opened.first_divergence.kinds == ["admitted", "batch_is_full"]
    assert opened.first_divergence.stock.admitted == []
    assert opened.first_divergence.fixed.admitted[0][0] == "queued"
    assert opened.reproduced is True
    assert opened.fix_set == ["latch"]
    assert opened.tried == ["aiter", "chunk-cap", "latch"]

    (closed,) = report.closed_loop
    assert closed.stall.start_pass == 0 and closed.stall.passes == FIRST_RUNNING_FINISH
    assert closed.first_divergence.pass_ == 0
    assert closed.fix_set == ["latch"]


def test_bisect_from_a_later_pass_finds_that_onset(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    report = run_bisect(trace, from_pass=4, modes=("closed-loop",))
    assert report.open_loop == []
    (closed,) = report.closed_loop
    assert closed.stall.start_pass == 4 and closed.first_divergence.pass_ == 4
    assert closed.fix_set == ["latch"]


def test_one_chunk_bisect_names_one_chunk(tmp_path):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace")
    report = run_bisect(trace, modes=("closed-loop",))
    (closed,) = report.closed_loop
    assert closed.stall.start_pass == 0 and closed.stall.head_rid == "second"
    assert closed.first_divergence.pass_ == 0
    assert closed.first_divergence.kinds == ["admitted", "error"]
    assert closed.first_divergence.stock.error.startswith("AssertionError")
    assert closed.first_divergence.fixed.error is None
    assert closed.fix_set == ["one-chunk"]
    assert closed.tried == ["aiter", "chunk-cap", "latch", "one-chunk"]


def test_cli_writes_deterministic_json_and_exits_1_on_stalls(tmp_path, capsys):
    trace = latch_reproduction(tmp_path / "latch.trace")
    outputs = []
    for n in range(2):
        out = tmp_path / f"bisect{n}.json"
        with pytest.raises(SystemExit) as exit_info:
            main(["bisect", str(trace), "--stall-passes", "8", "--json", str(out)])
        assert exit_info.value.code == 1
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    data = json.loads(outputs[0])
    assert data["open_loop"][0]["fix_set"] == ["latch"]
    assert data["closed_loop"][0]["stall"]["start_pass"] == 0
    assert data["closed_loop"][0]["first_divergence"]["pass"] == 0
    printed = capsys.readouterr().out
    assert "open-loop: 1 stock stall" in printed and "latch" in printed


def test_cli_exits_0_without_stalls(tmp_path, capsys):
    trace = one_chunk_reproduction(tmp_path / "one-chunk.trace", radix_cache=True)  # stock copes
    main(["bisect", str(trace)])  # returns: exit status 0
    assert "no stock stall" in capsys.readouterr().out


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bisect", str(tmp_path / "missing.trace")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "missing.trace" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"not a trace at all")
    with pytest.raises(SystemExit) as exit_info:
        main(["bisect", str(bad), "--from", "0"])
    assert exit_info.value.code == 2


def test_bisect_json_round_trips(tmp_path):
    trace = latch_reproduction(tmp_path / "latch.trace")
    report = run_bisect(trace, modes=("open-loop",))
    assert json.loads(dump_bisect(report))["version"] == 1


def test_open_loop_mode_says_nothing_of_the_closed_loop(tmp_path, capsys):
    trace = latch_reproduction(tmp_path / "latch.trace")
    with pytest.raises(SystemExit) as exit_info:
        main(["bisect", str(trace), "--mode", "open-loop"])
    assert exit_info.value.code == 1
    printed = capsys.readouterr().out
    assert "open-loop: 1 stock stall" in printed
    assert "closed-loop" not in printed and "closed loop" not in printed


def test_closed_loop_stalls_are_shown_at_their_recorded_pass(capsys):
    """The lpm sample's one-pass latch stall is recorded pass 867; the closed loop counts the idle
    passes too (its step 291405), and the table names the recorded pass, the step beside it."""
    from pathlib import Path

    sample = Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace"
    with pytest.raises(SystemExit) as exit_info:
        main(["bisect", str(sample), "--stall-passes", "1", "--mode", "closed-loop"])
    assert exit_info.value.code == 1
    printed = capsys.readouterr().out
    (row,) = [line.split() for line in printed.splitlines() if "(admitted)" in line]
    onset, passes, _head, diverged, _kinds, fix, step = row
    assert (onset, passes, diverged, fix) == ("867", "1", "867", "latch")
    assert int(step) > 867  # the loop step counts the idle passes the recording only counted
    assert "open-loop" not in printed
