"""A closed loop's own radix tree (replay/loop/arm_tree.py): sglang's RadixCache keyed by the
recorded prefix ids gives each arm the cache hits its own decisions left in it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from schedtrace.replay.loop.arm_tree import ArmTree, MatchHistory
from schedtrace.replay.loop.input import load_input
from schedtrace.replay.loop.scan import scan_trace
from schedtrace.replay.loop.run import closed_loop_report, run_arms
from schedtrace.replay.loop.state import LoopReq, LoopState
from schedtrace.replay.loop.tree_share import common_tokens
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.prefix_ids import prefix_ids

DFS_WEIGHT = Path(__file__).parent / "traces" / "dfs-weight-branch-order.trace"
KEY = bytes(32)
BLOCK = 16


def _req(rid: str, tokens: list[int], **fields) -> LoopReq:
    return LoopReq(rid, len(tokens), 8, 8, prefix_ids=prefix_ids(KEY, tokens, BLOCK), **fields)


def _state(waiting: list[LoopReq], *, chunked: LoopReq | None = None, evictable: int = 0) -> LoopState:
    return LoopState(waiting=waiting, running=[], chunked=chunked, batch_is_full=False, free=10_000,
                     evictable=evictable, req_slots_free=8)


SHARED = list(range(1000, 1040))  # 40 tokens: two whole blocks and 8 tokens into the third


def test_a_request_matches_what_its_sibling_landed_in_the_arms_tree() -> None:
    sibling = _req("a", SHARED + list(range(60)), prefix_len=0)
    waiting = _req("b", SHARED + list(range(100, 150)))
    state = _state([waiting], chunked=sibling)
    tree = ArmTree(BLOCK, 1, MatchHistory([(5, "b", 40, None)]))
    tree.start(state, [])
    tree.match(state, 0)
    assert waiting.prefix_len == 0  # nothing of the family is in this arm's tree yet

    sibling.tree_len = 64  # a chunk of the sibling landed
    tree.landed(state, [])
    tree.match(state, 1)
    # The ids share two blocks; the recorded match inside the third gives the tokens. The sibling
    # locks that path, so none of the match is in the evictable count.
    assert (waiting.prefix_len, waiting.prefix_cached) == (40, 0)

    state.chunked = None  # the sibling finished: its prompt is cached, unlocked
    state.evictable = 100
    tree.landed(state, ["a"])
    tree.match(state, 2)
    assert (waiting.prefix_len, waiting.prefix_cached) == (40, None)


def test_without_a_recorded_match_in_its_last_block_the_match_is_whole_blocks() -> None:
    sibling = _req("a", SHARED + list(range(60)))
    sibling.tree_len = 100
    waiting = _req("b", SHARED + list(range(100, 150)))
    state = _state([waiting], chunked=sibling)
    tree = ArmTree(BLOCK, 1, MatchHistory([]))
    tree.start(state, [])
    tree.match(state, 0)
    assert waiting.prefix_len == 32


@pytest.mark.parametrize("recent", ["f", "g"])
def test_eviction_takes_the_least_recently_matched_prefix(recent: str) -> None:
    """How much goes is the loop's evictable count; which, sglang's own LRU over the tree."""
    prompts = {family: [ord(family) * 100 + i for i in range(64)] for family in "fg"}
    done = [_req(f"{family}-done", prompts[family]) for family in "fg"]
    for req in done:
        req.tree_len = 64
    members = {family: _req(f"{family}-next", prompts[family] + [7, 8, 9]) for family in "fg"}
    state = _state([], evictable=128)
    state.running = done
    tree = ArmTree(BLOCK, 1, MatchHistory([]))
    tree.start(state, [])
    state.running = []
    tree.landed(state, ["f-done", "g-done"])  # both cached, unlocked
    state.waiting = [members[recent]]
    tree.match(state, 1)  # the recent family's path is the most recently used
    state.evictable = 64  # the loop evicted one prompt's worth
    tree.landed(state, [])
    state.waiting = list(members.values())
    tree.match(state, 2)
    assert {family: req.prefix_len for family, req in members.items()} == {
        family: 64 if family == recent else 0 for family in "fg"}


def _loop(path: Path):
    with TraceReader(path) as reader:
        scan = scan_trace(reader)
        return scan, load_input(reader, 0, scan)


def test_the_arms_tree_alone_reproduces_a_recording() -> None:
    """With every recorded match withheld, the stock loop's own tree still gives the waits the
    server had (the matches differ only within a block: 592 of a 600-token shared prompt)."""
    scan, loop = _loop(DFS_WEIGHT)
    bare = replace(loop, matches=[])
    runs = run_arms(None, ["stock"], loop=bare)
    check = closed_loop_report(bare, scan, runs).self_check
    assert check.requests >= 35 and (check.recorded_only, check.loop_only) == (0, 0), check
    assert (check.wait_error_p50, check.wait_error_p90) == (0.0, 0.0), check
    matched = [row.prefix_len for p in runs["stock"].passes for row in p.waiting if row.output_len == 0]
    assert 592 in matched, "no fresh request matched its family's shared prompt"


def test_a_counterfactual_arm_admits_with_the_hits_its_own_tree_holds() -> None:
    """The fixed arm runs this trace on another timeline. Each fresh request it admits matches at
    least the whole blocks it shares with a request running beside it (that prompt is in the
    arm's tree and locked there), where the recording's matches, revealed on the recording's
    timeline, gave several of them nothing."""
    _, loop = _loop(DFS_WEIGHT)
    ids = {a.rid: a.prefix_ids for a in loop.arrival_records}
    run = run_arms(None, ["fixed"], loop=loop)["fixed"]
    checked = hits = 0
    for p, decision in zip(run.passes, run.decisions):
        rows = {row.rid: row for row in p.waiting}
        beside = [r.rid for r in p.running if r.output_len >= 2]  # its prefill's result processed
        for rid, _ in decision.admitted:
            row = rows.get(rid)
            if row is None or row.output_len > 0 or not beside:
                continue
            shared = max(common_tokens(ids[rid], ids[other], BLOCK) for other in beside)
            assert row.prefix_len >= min(shared, row.input_len - 1), (p.seq, rid, row.prefix_len, shared)
            checked += 1
            hits += shared > 0
    assert checked >= 20 and hits >= 5, (checked, hits)


def test_the_report_says_where_the_cache_hits_came_from() -> None:
    from schedtrace.replay.loop.run import run_closed_loop

    samples = Path(__file__).parent.parent / "traces"
    assert run_closed_loop(DFS_WEIGHT, ["stock"]).prefix_matches == "arm-tree"
    assert run_closed_loop(samples / "hybrid-swa-gptoss.trace", ["stock"]).prefix_matches == "recorded"
    no_ids = Path(__file__).parent / "traces" / "v1-kv-pressure-fcfs.trace"  # recorded before prefix ids
    assert run_closed_loop(no_ids, ["stock"]).prefix_matches == "recorded"
