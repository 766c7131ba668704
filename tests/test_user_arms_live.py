"""A user diff where an arm goes beyond one process: pytest (repro) and a live server.

The repro test starts pytest runs of its own; the live server is the shared ``armed_sandbox``
(tests/conftest.py). The Ray workers' case runs on tests/test_ray.py's cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import generate

from schedtrace.arms import user, variants
from schedtrace.tracer.contract.names import STOCK

from repro_traces import LIVE_MARKER, latch_diff, latch_trace


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


def test_a_live_server_runs_the_diff_in_its_scheduler(armed_sandbox):
    server, diff = armed_sandbox.server, armed_sandbox.diff
    label = user.load(diff)
    out = generate(server, rid="arm-live-1", input_len=200, max_new_tokens=4)
    assert out["meta_info"]["completion_tokens"] == 4
    log = server.log_path.read_text()
    assert f"SCHEDTRACE_FIXES={diff.resolve()}: {label} applied" in log
    assert LIVE_MARKER in log  # the patched line ran in the scheduler process
