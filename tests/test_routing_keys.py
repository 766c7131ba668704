"""routing-key ties: sglang's own sort breaks them by the keys' text; replay takes that order from the recording."""

from __future__ import annotations

from types import SimpleNamespace

from schedtrace.replay.routing_keys import keys_renamed, recorded_names


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
