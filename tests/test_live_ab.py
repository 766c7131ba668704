"""Live A/B under the demo overload: stock vs ``SCHEDTRACE_FIXES=all`` on the real server.

Two fresh sandbox servers, one after the other (stock, then fixed), each
recording a trace under the KV-pressure arguments while sglang's
bench_serving drives it with a small bounded load. Every request must
complete in both arms; what each arm's scheduler did (completed requests,
stalls, over-asks, asserts) is read back from its traces and reported.
``bench/live_ab.py`` is the same A/B (``schedtrace.tracer.sandbox.ab``) with
more load and alternating runs.

Select it alone with ``pytest -m live``; it is part of ``make test``.
"""

from __future__ import annotations

import json

import pytest

from schedtrace.tracer.sandbox.ab import ARMS, run_arm
from schedtrace.tracer.sandbox.load import LoadSpec

# Enough to queue, chunk and fill the 40k-token KV pool (about 48k prompt
# tokens in flight), small enough for a few minutes on 2 cores.
LIVE_LOAD = LoadSpec(num_prompts=16, max_concurrency=16, input_len=3000, output_len=32, timeout_s=300.0)

pytestmark = [pytest.mark.live, pytest.mark.own_server, pytest.mark.timeout(900)]


def test_stock_and_fixed_both_complete_every_request(tmp_path, record_property):
    runs = {arm: run_arm(arm, LIVE_LOAD, tmp_path / arm) for arm in ARMS}

    report = {}
    for arm, run in runs.items():
        facts, result = run.facts, run.result
        report[arm] = {
            "completed": result.completed,
            "num_prompts": result.num_prompts,
            "finish_records": facts.finished,
            "stalls": [(s.start_pass, s.passes, s.head_rid) for s in facts.stalls],
            "over_asks": facts.over_asks,
            "asserts": facts.asserts,
            "exceptions": facts.exceptions[:5],
        }
        print(run.line())
        assert result.failed == 0 and result.completed == LIVE_LOAD.num_prompts, run.line()
        # The scheduler itself saw every request arrive and finish.
        assert facts.files >= 1 and facts.pass_records > 0
        assert facts.arrivals >= LIVE_LOAD.num_prompts
        assert facts.finished >= LIVE_LOAD.num_prompts
    record_property("live_ab", json.dumps(report, sort_keys=True))

    # The fixed arm really ran the fixed scheduler; the stock arm did not.
    assert runs["fixed"].fixes_logged
    assert not runs["stock"].fixes_logged
