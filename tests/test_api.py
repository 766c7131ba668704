"""The public API: docs/api.md's example runs and prints what the page says; the package needs no sglang."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import schedtrace
from schedtrace.cli import run

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "api.md"
SAMPLE = "traces/kv-pressure-lpm-24k.trace"


def doc_blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_example_prints_what_the_page_says(tmp_path):
    (example,), (printed,) = doc_blocks("python"), doc_blocks("text")
    os.symlink(REPO / "traces", tmp_path / "traces")
    (tmp_path / "out").mkdir()
    # The report the page's example reads, made by the CLI's own code in this process (sglang is loaded here).
    assert run(["replay", str(REPO / SAMPLE), "--json", str(tmp_path / "out" / "replay.json")]) == 0
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed


def test_every_public_name_resolves_without_sglang_click_or_rich():
    code = ("import sys\n"
            "for blocked in ('sglang', 'click', 'rich', 'textual'):\n"
            "    sys.modules[blocked] = None\n"
            "import schedtrace\n"
            "missing = [n for n in schedtrace.__all__ if getattr(schedtrace, n, None) is None]\n"
            "assert not missing, missing\n"
            "print(sorted(m for m, v in sys.modules.items()"
            "            if v is not None and m.split('.')[0] in ('sglang', 'torch', 'click', 'rich')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_import_schedtrace_loads_nothing_until_a_name_is_used():
    done = subprocess.run([sys.executable, "-c", "import sys, schedtrace; "
                           "print(sorted(m for m in sys.modules if m.startswith('schedtrace')))"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "['schedtrace']", done.stderr


def test_open_trace_picks_one_rank_and_closes_with_the_block(tmp_path):
    import shutil

    with schedtrace.open_trace([REPO / SAMPLE]) as trace:
        assert isinstance(trace, schedtrace.RankTrace) and trace.label == "tp0"
        first = trace.pass_at(0)
        assert first.seq == trace.header.first_pass
    assert not trace._open  # the block closed every part it had open
    folder = tmp_path / "set"
    folder.mkdir()
    shutil.copy(REPO / SAMPLE, folder / "a.trace")
    with schedtrace.open_trace(folder, rank="tp0") as again:
        assert again.fingerprint() == trace.fingerprint()
    try:
        schedtrace.open_trace(folder, rank="tp7")
    except schedtrace.SchedtraceError as exc:
        assert "--rank tp7 names no rank" in str(exc)
    else:
        raise AssertionError("a rank the files do not hold must be refused")
    assert "schedtrace" not in dir(schedtrace) and "open_trace" in dir(schedtrace)
