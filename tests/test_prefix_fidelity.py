"""Prefix identity and the queue order: sglang's own calc_priority, on a real tree, against the replay.

The "server" side is sglang's ``SchedulePolicy`` over a real (simulated)
``RadixCache`` holding cached prefixes and real ``Req``s with token ids; the
replay side sees only what the recorder writes (lengths, this pass's
matches, keyed block ids, the recorded order) and runs ``PassDriver``.
"""

from __future__ import annotations

import random
from array import array

import msgspec
import pytest
import torch

from schedtrace.replay.driver import PassDriver
from schedtrace.replay.loop.tree_order import BlockAges, first_inserts
from schedtrace.testing import builders
from schedtrace.tracer.contract.order import OrderError, in_order, order_indexes, order_runs
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES, block_tokens, id_count, keyed_id, prefix_ids, split_ids
from schedtrace.tracer.contract.schema import Arrival, KvSnapshot, WaitingReq

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.sampling.sampling_params import SamplingParams

KEY = b"k" * 32
BLOCK = 16


# --- prefix ids -----------------------------------------------------------------------------


def test_equal_prefixes_have_equal_ids_up_to_the_block_where_they_part() -> None:
    shared = list(range(100, 140))  # 40 tokens: two whole blocks and 8 of the third
    a = prefix_ids(KEY, shared + [1] * 30, BLOCK)
    b = prefix_ids(KEY, shared + [2] * 30, BLOCK)
    assert len(a) == id_count(70, BLOCK) * PREFIX_ID_BYTES == 5 * PREFIX_ID_BYTES
    ids_a, ids_b = split_ids(a), split_ids(b)
    assert ids_a[:2] == ids_b[:2] and all(x != y for x, y in zip(ids_a[2:], ids_b[2:]))


def test_ids_are_keyed_namespaced_and_hide_the_tokens() -> None:
    tokens = list(range(64))
    assert prefix_ids(KEY, tokens, BLOCK) != prefix_ids(b"j" * 32, tokens, BLOCK)  # another run links nothing
    assert prefix_ids(KEY, tokens, BLOCK) != prefix_ids(KEY, tokens, BLOCK, "lora-a\0")  # another namespace
    assert keyed_id(KEY, "route") == keyed_id(KEY, "route") != keyed_id(b"j" * 32, "route")
    data = prefix_ids(KEY, tokens, BLOCK)
    for token in tokens:  # no token id appears as bytes in the ids
        assert token.to_bytes(8, "little") not in data


def test_the_block_is_the_page_or_sixteen() -> None:
    assert block_tokens(1) == 16 and block_tokens(64) == 64


# --- order runs -----------------------------------------------------------------------------


@pytest.mark.parametrize("perm", [[0, 1, 2, 3], [2, 3, 0, 1], [3, 2, 1, 0], [], [1, 0]])
def test_order_runs_round_trip(perm) -> None:
    runs = order_runs(perm)
    assert order_indexes(runs, len(perm)) == perm
    assert (runs is None) == (perm == sorted(perm))


@pytest.mark.parametrize("runs", [[0], [0, 5], [-1, 2], [0, 1, 0, 1], [1, 1], [0, 0, 0, 2]])
def test_runs_that_are_no_permutation_are_refused(runs) -> None:
    with pytest.raises(OrderError):
        in_order(["a", "b"], runs)


# --- the queue order against the real policy ------------------------------------------------


def _queue(seed: int, n: int):
    """Requests in families sharing a prefix, some of them cached in the server's tree."""
    rng = random.Random(seed)
    tree = RadixCache.create_simulated()
    families = [[rng.randrange(3, 500) for _ in range(rng.choice((40, 200, 600)))] for _ in range(4)]
    for prefix in families[:2]:  # two families were served before: their prefix is cached
        tree.insert(InsertParams(key=RadixKey(array("q", prefix[: len(prefix) // 2])),
                                 value=torch.empty(len(prefix) // 2, dtype=torch.bool)))
    reqs, tokens = [], {}
    for k in range(n):
        family = rng.randrange(-2, len(families))
        ids = (families[family] if family >= 0 else []) + [rng.randrange(3, 500) for _ in range(rng.randrange(5, 300))]
        rid = f"r{seed}-{k}"
        req = Req(rid, "", array("q", ids), SamplingParams(max_new_tokens=rng.randrange(4, 200)), priority=rng.randrange(3))
        req.time_stats.wait_queue_entry_time = float(k)
        req.arrival_processed_tokens = rng.randrange(0, 5000)
        reqs.append(req)
        tokens[rid] = ids
    return tree, reqs, tokens


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "hrrn", "shortest-prefill-first", "fcfs", "lof"])
@pytest.mark.parametrize("seed", range(4))
def test_the_replayed_order_is_the_real_policys(policy: str, seed: int) -> None:
    header = builders.header(server_args=builders.server_args(schedule_policy=policy, max_running_requests=64),
                             prefix_block=BLOCK, max_req_slots=64)
    driver = PassDriver(header)
    tree, reqs, tokens = _queue(seed, 24)
    entry = list(reqs)
    server = SchedulePolicy(policy, tree, enable_hierarchical_cache=False, enable_priority_scheduling=False,
                            schedule_low_priority_values_first=False)
    processed = 7000
    with driver._config.installed():  # the server's published config, as the driver publishes it
        server.calc_priority(reqs, None, processed_tokens=processed)
    at = {id(r): i for i, r in enumerate(entry)}
    recorded = order_runs([at[id(r)] for r in reqs])
    for req in entry:  # what the recorder writes of each: its arrival, with ids and hrrn's stamp
        driver.note(Arrival(0, req.rid, len(tokens[req.rid]), req.sampling_params.max_new_tokens,
                            prefix_ids=prefix_ids(KEY, tokens[req.rid], BLOCK),
                            processed_tokens=req.arrival_processed_tokens))
    waiting = [WaitingReq(r.rid, len(tokens[r.rid]), 0, r.sampling_params.max_new_tokens, r.prefix_len, r.priority)
               for r in entry]
    p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=200, evictable=0), req_slots_free=8,
                             order=recorded, processed_tokens=processed)
    decision = driver.decide(p, "stock")
    assert decision.queue_order == recorded
    if policy in ("lpm", "hrrn", "shortest-prefill-first"):
        # the in-batch check ran on the recorded ids: without them a family is never deprioritized
        blind = PassDriver(builders.header(server_args=header.server_args, prefix_block=0, max_req_slots=64))
        if server._compute_prefix_matches(list(entry), server.policy):
            assert blind.decide(p, "stock").queue_order != recorded


def test_random_replays_the_recorded_draw() -> None:
    header = builders.header(server_args=builders.server_args(schedule_policy="random"), prefix_block=BLOCK)
    driver = PassDriver(header)
    waiting = [WaitingReq(f"q{k}", 100 + k, 0, 10, 0) for k in range(6)]
    for runs in ([5, 1, 0, 5], [2, 2, 0, 2, 4, 2]):
        p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=5, evictable=0), req_slots_free=4,
                                 order=runs)
        assert driver.decide(p, "stock").queue_order == runs


def test_dfs_weight_nests_a_match_that_ends_inside_a_block_without_the_recorded_order() -> None:
    """A family's 600-token prompt ends 8 tokens into block 37; one member's own prompt is cached
    too (a retracted request's). The server's walk puts that deeper member before the three
    matching 600; the closed loop has no recorded order to break ties with, so the tree's shape
    alone must give it."""
    rng = random.Random(5)
    family = [rng.randrange(3, 500) for _ in range(600)]
    tree = RadixCache.create_simulated()
    inputs = {f"m{k}": family + [rng.randrange(3, 500) for _ in range(220)] for k in range(4)}
    inputs["single"] = [rng.randrange(3, 500) for _ in range(300)]
    for key in (family, inputs["m0"]):
        tree.insert(InsertParams(key=RadixKey(array("q", key)), value=torch.empty(len(key), dtype=torch.bool)))
    reqs = [Req(rid, "", array("q", ids), SamplingParams(max_new_tokens=50)) for rid, ids in inputs.items()]
    queue = [reqs[1], reqs[2], reqs[3], reqs[4], reqs[0]]  # m0 queued last, as a retracted request is
    server = SchedulePolicy("dfs-weight", tree, enable_hierarchical_cache=False, enable_priority_scheduling=False,
                            schedule_low_priority_values_first=False)
    entry = list(queue)
    server.calc_priority(queue, None)
    assert [r.rid for r in queue] == ["m0", "m1", "m2", "m3", "single"]

    header = builders.header(server_args=builders.server_args(schedule_policy="dfs-weight"), prefix_block=BLOCK)
    driver = PassDriver(header)
    for req in entry:
        driver.note(Arrival(0, req.rid, len(inputs[req.rid]), 50, prefix_ids=prefix_ids(KEY, inputs[req.rid], BLOCK)))
    waiting = [WaitingReq(r.rid, len(inputs[r.rid]), 0, 50, r.prefix_len) for r in entry]
    assert [w.prefix_len for w in waiting] == [600, 600, 600, 0, len(inputs["m0"])]
    p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=200, evictable=0), req_slots_free=8)
    assert in_order([w.rid for w in waiting], driver.decide(p, "stock").queue_order) == [r.rid for r in queue]


def test_a_closed_loop_breaks_dfs_weight_ties_by_the_branch_the_tree_made_first() -> None:
    """Two families' prompts cached, f0's first; one member of each waits, f1's ahead. Equal
    weights: the server's walk takes the older branch. A closed loop has no recorded order: blocks
    already in the tree at its start are ranked by the arrival that first carried them."""
    rng = random.Random(7)
    prompts = {f: [rng.randrange(3, 500) for _ in range(600)] for f in ("f0", "f1")}
    tree = RadixCache.create_simulated()
    for f in ("f0", "f1"):
        tree.insert(InsertParams(key=RadixKey(array("q", prompts[f])), value=torch.empty(600, dtype=torch.bool)))
    inputs = {f"{f}m{k}": prompts[f] + [rng.randrange(3, 500) for _ in range(100)] for f in ("f0", "f1") for k in (0, 1)}
    queue = [Req(rid, "", array("q", inputs[rid]), SamplingParams(max_new_tokens=50)) for rid in ("f1m1", "f0m1")]
    server = SchedulePolicy("dfs-weight", tree, enable_hierarchical_cache=False, enable_priority_scheduling=False,
                            schedule_low_priority_values_first=False)
    server.calc_priority(queue, None)
    assert [r.rid for r in queue] == ["f0m1", "f1m1"]

    header = builders.header(server_args=builders.server_args(schedule_policy="dfs-weight"), prefix_block=BLOCK)
    arrivals = [Arrival(t, rid, 700, 50, prefix_ids=prefix_ids(KEY, inputs[rid], BLOCK))
                for t, rid in enumerate(["f0m0", "f1m0", "f1m1", "f0m1"])]  # the first members made the branches
    driver = PassDriver(header)
    for arrival in arrivals:
        driver.note(arrival)
    waiting = [WaitingReq(rid, 700, 0, 50, 600) for rid in ("f1m1", "f0m1")]
    p = builders.pass_record(0, waiting=waiting, kv=KvSnapshot(available=200, evictable=0), req_slots_free=8)
    from schedtrace.replay.loop.state import LoopReq, LoopState

    made = [LoopReq(rid=rid, input_len=700, max_new_tokens=50, target_output=50, tree_len=700) for rid in ("f1m0", "f0m0")]
    start = LoopState(waiting=[], running=made, chunked=None, batch_is_full=False, free=5000, evictable=0, req_slots_free=8)
    ages = BlockAges(BLOCK, arrivals).for_arm(start)  # in the tree at the loop's start: ranked by first arrival
    with_ages = msgspec.structs.replace(p, order=ages.queue_order(waiting))
    assert in_order(["f1m1", "f0m1"], driver.decide(with_ages, "stock").queue_order) == ["f0m1", "f1m1"]
    assert driver.decide(p, "stock").queue_order is None  # queue order alone keeps f1's member first


def test_an_arms_tree_ages_a_branch_by_the_prefill_that_inserted_it_not_the_first_arrival() -> None:
    """f1's first member arrives first, f0's prefills first: the server's tree (sglang's own
    RadixCache, inserted in prefill order) walks f0's branch first, and so does the arm's TreeAges;
    the arrival ranks (BlockAges) would put f1's."""
    from schedtrace.replay.loop.state import LoopReq, LoopState

    rng = random.Random(11)
    prompts = {f: [rng.randrange(3, 500) for _ in range(600)] for f in ("f0", "f1")}
    inputs = {f"{f}m{k}": prompts[f] + [rng.randrange(3, 500) for _ in range(100)] for f in ("f0", "f1") for k in (0, 1)}
    tree = RadixCache.create_simulated()
    for rid in ("f0m0", "f1m0"):  # the prefill order
        tree.insert(InsertParams(key=RadixKey(array("q", inputs[rid])), value=torch.empty(700, dtype=torch.bool)))
    queue = [Req(rid, "", array("q", inputs[rid]), SamplingParams(max_new_tokens=50)) for rid in ("f1m1", "f0m1")]
    SchedulePolicy("dfs-weight", tree, enable_hierarchical_cache=False, enable_priority_scheduling=False,
                   schedule_low_priority_values_first=False).calc_priority(queue, None)
    assert [r.rid for r in queue] == ["f0m1", "f1m1"]

    arrivals = [Arrival(t, rid, 700, 50, prefix_ids=prefix_ids(KEY, inputs[rid], BLOCK))
                for t, rid in enumerate(["f1m0", "f0m0", "f1m1", "f0m1"])]
    base = BlockAges(BLOCK, arrivals)
    start = LoopState(waiting=[], running=[], chunked=None, batch_is_full=False, free=5000, evictable=0, req_slots_free=8)
    ages = base.for_arm(start)
    for rid in ("f0m0", "f1m0"):  # each lands in its own step
        start.running.append(LoopReq(rid=rid, input_len=700, max_new_tokens=50, target_output=50, tree_len=700))
        ages.landed(start)
    waiting = [WaitingReq(rid, 700, 0, 50, 600) for rid in ("f1m1", "f0m1")]
    assert in_order([w.rid for w in waiting], ages.queue_order(waiting)) == ["f0m1", "f1m1"]
    at_start = LoopState(waiting=[], running=list(start.running), chunked=None, batch_is_full=False, free=5000,
                         evictable=0, req_slots_free=8)
    by_arrival = base.for_arm(at_start)  # the same tree, already there at the start: arrival ranks
    assert in_order([w.rid for w in waiting], by_arrival.queue_order(waiting)) == ["f1m1", "f0m1"]

    # The recording says which prefilled first: the ages at the start follow it, not the arrivals.
    inserted = first_inserts({"f0m0": (3, False, 0), "f1m0": (5, False, 0)}, overlap=False)
    by_prefill = BlockAges(BLOCK, arrivals, inserted).for_arm(at_start)
    assert in_order([w.rid for w in waiting], by_prefill.queue_order(waiting)) == ["f0m1", "f1m1"]


def test_a_passs_new_chunk_enters_the_tree_before_its_whole_prefills_only_under_overlap() -> None:
    """The next pass stashes a new chunk at its start; a whole prefill's result is processed at the
    pass's end, or, under the overlap scheduler, during the next pass after that stash."""
    firsts = {"whole": (7, False, 0), "chunk": (7, True, 1), "earlier": (6, True, 0)}
    for overlap, expected in ((False, ["earlier", "whole", "chunk"]), (True, ["earlier", "chunk", "whole"])):
        keys = first_inserts(firsts, overlap)
        assert sorted(firsts, key=keys.__getitem__) == expected
