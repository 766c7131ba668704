"""routing-key ties: sglang's own sort breaks them by the keys' text; replay takes that order from the recording."""

from __future__ import annotations

from types import SimpleNamespace

from schedtrace.replay.routing_keys import keys_renamed, recorded_names
from schedtrace.tracer.contract.order import order_indexes


def sort_by_routing_key(waiting: list, running: list) -> list[str]:
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    queue = list(waiting)
    SchedulePolicy._sort_by_routing_key(queue, SimpleNamespace(reqs=running))
    return [r.rid for r in queue]


def reqs(keys: dict[str, str | None]) -> list[SimpleNamespace]:
    return [SimpleNamespace(rid=rid, routing_key=key) for rid, key in keys.items()]


# The server's keys, and the keyed ids a trace holds for them: the ids' text sorts the other way.
TEXT_TO_ID = {"family-0": "7301", "family-1": "1202", "family-2": "5003"}


def test_equal_counts_and_absent_keys_sort_by_text_and_replay_recovers_it_from_the_order() -> None:
    waiting = {"a": "family-1", "b": "family-0", "c": None, "d": "family-2", "e": "family-1", "f": "family-0"}
    running = {"r1": "family-0", "r2": "family-1"}  # one each: a tie, broken by the text
    on_server = sort_by_routing_key(reqs(waiting), reqs(running))
    assert on_server == ["b", "f", "a", "e", "c", "d"]  # family-0, family-1; then no key, family-2

    as_ids = {rid: None if k is None else TEXT_TO_ID[k] for rid, k in waiting.items()}
    entry, run = reqs(as_ids), reqs({rid: TEXT_TO_ID[k] for rid, k in running.items()})
    assert sort_by_routing_key(entry, run) != on_server  # the ids alone break the tie the other way

    recorded = [list(waiting).index(rid) for rid in on_server]
    with keys_renamed([*entry, *run], recorded_names(entry, recorded)):
        replayed = sort_by_routing_key(entry, run)
    assert replayed == on_server
    assert [r.routing_key for r in entry] == list(as_ids.values())  # the ids are back afterwards


def test_counts_are_still_sglangs_own() -> None:
    """The recorded order names the keys only; a count that differs still reorders, so a wrong
    running batch is caught."""
    waiting = reqs({"a": "1", "b": "2"})
    names = recorded_names(waiting, [0, 1])  # recorded: key 1 before key 2
    running = reqs({"r1": "2", "r2": "2", "r3": "1"})  # key 2 runs twice: it goes first
    with keys_renamed([*waiting, *running], names):
        assert sort_by_routing_key(waiting, running) == ["b", "a"]


def test_a_closed_loop_learns_the_key_text_order_from_the_recorded_passes() -> None:
    """A queue the recording never saw: KeyTextOrder, taught by recorded passes whose sort broke
    ties, names its keys so that sglang's own sort orders it as the server's text would."""
    import random

    from schedtrace.replay.routing_keys import KeyTextOrder
    from schedtrace.testing.builders import pass_record
    from schedtrace.tracer.contract.order import order_runs
    from schedtrace.tracer.contract.schema import Arrival, RunningReq, WaitingReq

    texts = {f"family-{i}": str(9000 - 997 * i) for i in range(5)}  # ids sort against the text
    rng = random.Random(7)

    def queue(tag: str, n: int) -> dict[str, str | None]:
        return {f"{tag}-{i}": rng.choice([*texts, None]) for i in range(n)}

    learnt = KeyTextOrder()
    every: dict[str, str | None] = {}
    for step in range(12):  # the recording: each pass's order is the server's sort, by text
        waiting, running = queue(f"w{step}", 6), queue(f"r{step}", 2)
        every |= waiting | running
        for rid, text in (waiting | running).items():
            learnt.note(Arrival(t_ns=step, rid=rid, input_len=1, max_new_tokens=1,
                                routing_key=None if text is None else int(texts[text])))
        on_server = sort_by_routing_key(reqs(waiting), reqs(running))
        if on_server == list(waiting) or not any(running.values()):
            continue  # the recorder writes no order for these
        learnt.observe(pass_record(
            step, waiting=[WaitingReq(rid, 1, 0, 1, 0) for rid in waiting],
            running=[RunningReq(rid, 1, 1, 1) for rid in running],
            order=order_runs([list(waiting).index(rid) for rid in on_server])))
    assert learnt.pairs > 0

    for trial in range(20):  # the loop's own queues
        waiting, running = queue(f"loop{trial}", 7), queue(f"loop-run{trial}", 3)
        for rid, text in (waiting | running).items():
            learnt.note(Arrival(t_ns=99, rid=rid, input_len=1, max_new_tokens=1,
                                routing_key=None if text is None else int(texts[text])))
        on_server = sort_by_routing_key(reqs(waiting), reqs(running))
        as_ids = {rid: None if t is None else texts[t] for rid, t in waiting.items()}
        entry = reqs(as_ids)
        run = reqs({rid: None if t is None else texts[t] for rid, t in running.items()})
        runs = learnt.queue_order([WaitingReq(rid, 1, 0, 1, 0) for rid in waiting])
        with keys_renamed([*entry, *run], recorded_names(entry, order_indexes(runs, len(entry)))):
            assert sort_by_routing_key(entry, run) == on_server, trial
