"""A user diff where an arm goes beyond one process: pytest (repro) and a live server.

Slow: each test starts processes of its own (pytest runs, one sandbox server). The Ray
workers' case runs on tests/test_ray.py's cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import generate

from schedtrace.arms import user, variants
from schedtrace.arms.shipped import BUILTIN_DIFF_PATH
from schedtrace.tracer.contract.names import STOCK

from repro_traces import latch_trace

REPO = Path(__file__).resolve().parent.parent
MARKER = "schedtrace-live-arm: batch_is_full re-evaluated"


def latch_diff(path: Path, *, marker: bool = False) -> Path:
    """The latch fix alone, as its diff section of builtin-fixes.diff (plus a log line, live)."""
    sections = re.split(r"(?=^diff --git )", BUILTIN_DIFF_PATH.read_text(), flags=re.M)
    text = next(s for s in sections if s.startswith("diff --git") and "managers/scheduler.py" in s.splitlines()[0])
    if marker:
        new = "+        running_batch.batch_is_full = False\n"
        assert text.count(new) == 1
        text = text.replace(new, new + f'+        logger.warning("{MARKER}")\n')
        head = re.search(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@", text)
        text = text.replace(head.group(0), f"@@ -{head[1]},{head[2]} +{head[3]},{int(head[4]) + 1} @@")
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def back_to_stock():
    yield
    variants.set_active(frozenset())


def test_repro_with_a_diff_fails_on_stock_and_passes_with_the_diff(tmp_path, monkeypatch):
    from schedtrace.replay.repro.pipeline import build
    from schedtrace.replay.repro.verify import FAILED, PASSED, run_variants

    monkeypatch.chdir(tmp_path)
    latch_trace(Path("latch.trace"))
    label = user.load(latch_diff(Path("latch.diff")))
    repro = build("latch.trace", 0, fix=label)
    assert repro.fixes == label
    assert "SCHEDTRACE_FIXES=./latch.diff python -m pytest" in " ".join(repro.text.split())
    module = tmp_path / "test_latch_diff.py"
    module.write_text(repro.text)
    # As its user runs it: the diff beside the module, SCHEDTRACE_FIXES=./latch.diff, through the plugin.
    runs = {r.variant: r for r in run_variants([module], [STOCK, label])}
    assert runs[STOCK].outcome == FAILED, runs[STOCK].detail
    assert runs[label].outcome == PASSED, runs[label].detail


@pytest.mark.own_server
@pytest.mark.timeout(900)
def test_a_live_server_runs_the_diff_in_its_scheduler(tmp_path):
    from schedtrace.tracer.sandbox.server import SandboxServer

    diff = latch_diff(tmp_path / "latch-live.diff", marker=True)
    label = user.load(diff)
    server = SandboxServer(fixes=str(diff), log_path=tmp_path / "server.log")
    with server:
        out = generate(server, rid="arm-live-1", input_len=200, max_new_tokens=4)
        assert out["meta_info"]["completion_tokens"] == 4
    log = (tmp_path / "server.log").read_text()
    assert f"SCHEDTRACE_FIXES={diff.resolve()}: {label} applied" in log
    assert MARKER in log  # the patched line ran in the scheduler process
