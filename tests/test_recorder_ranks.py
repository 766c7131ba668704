"""Rank identity: the header's ranks and widths, and one run id for every rank of a server start.

The real path, a launcher spawning two scheduler ranks that share its run id
through the environment alone, is checked on the real ``--tp 2`` sandbox
(tests/test_sandbox_ranks.py); these are the parts below it.
"""

from __future__ import annotations

from schedtrace.tracer.contract.names import RUN_ID_ENV
from schedtrace.tracer.recorder.naming import ensure_run_id, trace_stem
from schedtrace.tracer.recorder.ranks import ranks_of, read_ranks


def test_before_publish_the_ranks_come_from_the_schedulers_own_attributes() -> None:
    from types import SimpleNamespace

    ranks = read_ranks(SimpleNamespace(tp_rank=1, tp_size=2))
    assert (ranks["tp_rank"], ranks["tp_size"], ranks["attn_dp_rank"]) == (1, 2, None)


def test_each_start_gets_its_own_run_id_and_children_inherit_it() -> None:
    first, second = {}, {}
    assert ensure_run_id(first) != ensure_run_id(second)  # two launchers, two runs
    child = dict(first)
    assert ensure_run_id(child) == first[RUN_ID_ENV]  # a rank started from the first launcher


def test_an_operator_set_run_id_is_kept_made_safe_for_file_names() -> None:
    environ = {RUN_ID_ENV: "bench 7/node a"}  # one id for the launchers of every node
    assert ensure_run_id(environ) == "bench_7_node_a" == environ[RUN_ID_ENV]


def test_the_stem_names_every_rank_and_width_it_needs() -> None:
    ranks = ranks_of(tp_rank=3, tp_size=4, dp_rank=1, dp_size=2, pp_rank=1, pp_size=2)
    assert trace_stem("r1", ranks, 77, host="gpu node/1") == "schedtrace-r1-gpu_node_1-tp3-dp1-pp1-pid77"
    assert trace_stem("", ranks_of(), 5, host="h") == "schedtrace-h-tp0-dp0-pp0-pid5"
