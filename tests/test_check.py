"""``schedtrace check``: a change over the sample traces, one row per trace, and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from schedtrace.arms.shipped import BUILTIN_DIFF_PATH
from schedtrace.cli import run

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "traces"
LPM = TRACES / "kv-pressure-lpm-24k.trace"
KIMI = TRACES / "hybrid-mamba-kimi.trace"
LATCH_WORKLOAD = TRACES / "latch-abort-live.trace"  # the demo's live workload: stock stalls on the latch


def test_check_over_the_sample_traces_rows_total_and_the_gate(tmp_path, capsys):
    out = tmp_path / "check.json"
    # The four fixes as a diff change the lpm sample's pass 867 and the latch workload's stall
    # (traces/README.md), and nothing on the others.
    assert run(["check", str(TRACES), "--new", str(BUILTIN_DIFF_PATH), "--fail-on", "change", "--json", str(out)]) == 1
    shown = capsys.readouterr()
    report = json.loads(out.read_text())
    rows = {Path(r["trace"]).name: r for r in report["rows"]}
    assert sorted(rows) == sorted(p.name for p in TRACES.glob("*.trace"))
    assert report["new"].startswith("builtin-fixes.diff@") and report["old"] == "stock"
    assert report["arms"][report["new"]].startswith(report["new"] + ": diff of python/sglang/srt/managers/")
    lpm = rows[LPM.name]
    assert lpm["changed"] >= 1 and lpm["first_changed"] == 867
    latch = rows[LATCH_WORKLOAD.name]
    assert latch["changed"] > 100 and latch["stalls_removed"] == 1
    assert all(r["changed"] == 0 for name, r in rows.items() if name not in (LPM.name, LATCH_WORKLOAD.name))
    assert report["total"]["changed"] == lpm["changed"] + latch["changed"]
    assert report["total"]["passes"] == sum(r["passes"] for r in rows.values())
    assert sorted(report["tripped"]) == sorted([lpm["trace"], latch["trace"]])
    assert f"total ({len(rows)} traces)" in shown.out and "--fail-on change: tripped on 2 traces" in shown.out
    # The default gate is an added stall: the fixes add none.
    assert run(["check", str(LPM), "--new", str(BUILTIN_DIFF_PATH)]) == 0


def test_check_closed_loop_adds_the_first_admission_waits(tmp_path):
    out = tmp_path / "check.json"
    assert run(["check", str(KIMI), "--new", "fixed", "--closed-loop", "--fail-on", "wait", "--json", str(out)]) in (0, 1)
    row = json.loads(out.read_text())["rows"][0]
    old50, new50 = row["wait_p50"]
    old90, new90 = row["wait_p90"]
    assert 0 <= old50 <= old90 and 0 <= new50 <= new90
    assert json.loads(out.read_text())["tripped"] == ([row["trace"]] if new90 > old90 else [])


def test_check_usage_errors_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.diff"
    bad.write_text(BUILTIN_DIFF_PATH.read_text().replace("running_batch.batch_is_full = False", "x = 1", 1))
    for args, expected in (
        (["check", str(LPM), "--new", str(bad)], "bad.diff: python/sglang/srt/managers/scheduler.py hunk 1"),
        (["check", str(LPM), "--new", "fixed", "--fail-on", "wait"], "give --closed-loop"),
        (["check", str(LPM)], "--new ARM"),
    ):
        assert run(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expected in err, err
