"""routing-key ties in replay: sglang breaks them by a key's text, which a trace holds only as a keyed id.

``SchedulePolicy._sort_by_routing_key`` sorts the queue by (whether the running
batch lacks the key, minus its count there, the key's text). Keys of equal
count, and every key the running batch lacks, fall to the text, whose order
the keyed ids (docs/trace-format.md) do not keep. For one ``calc_priority``,
``keys_renamed`` names each key so that its text sorts as the key first
appears in the pass's recorded queue order (``Pass.order``); the rest (the
counts, the groups, the stable order of requests sharing a key) is
re-derived by sglang's own sort and checked against the recording. A
closed loop's queues have no recorded order: ``KeyTextOrder`` learns the
keys' text order from the recording's passes instead.
Pure: no sglang, no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Final

from schedtrace.tracer.contract.order import OrderError, order_indexes, order_runs
from schedtrace.tracer.contract.schema import Arrival, Pass, WaitingReq

ROUTING_KEY: Final = "routing-key"  # the policy whose order reads the keys' text
_ABSENT: Final = "~"  # starts the name of a key only the running batch holds: never a waiting key's name


def recorded_names(entry: Sequence[Any], recorded: Sequence[int]) -> dict[str, str]:
    """A name per routing key of ``entry`` (the queue in entry order) that sorts as the key first
    appears in ``recorded`` (entry indexes in the recorded queue order, ``order_indexes(Pass.order)``)."""
    names: dict[str, str] = {}
    for i in recorded:
        key = entry[i].routing_key
        if key and key not in names:
            names[key] = f"{len(names):09d}"
    return names


@contextmanager
def keys_renamed(reqs: Sequence[Any], names: dict[str, str]) -> Iterator[None]:
    """``reqs``' routing keys under ``names`` (a key not named gets a name no named one has), then back."""
    saved = [(req, req.routing_key) for req in reqs if req.routing_key]  # all read before any is renamed
    for req, key in saved:
        req.routing_key = names.get(key, _ABSENT + key)
    try:
        yield
    finally:
        for req, key in saved:
            req.routing_key = key


class KeyTextOrder:
    """The order of the keys' text, learnt from a recording's passes, for a closed loop's queues.

    A closed loop decides on queues the recording never saw, so no pass's order names their keys.
    But text order is one order for the whole run: every recorded pass whose sort broke a tie
    between two keys (equal counts in the running batch, or both absent from it) shows which one's
    text is first. ``queue_order`` puts a loop queue's keys in the order those observations give
    (first appearance where none says), which the driver's ``recorded_names`` turns into names.
    """

    LIMIT: ClassVar[int] = 1 << 20  # keys and pairs kept: a hostile trace cannot grow them without bound

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}  # rid -> its routing key (from its arrival)
        self.before: dict[int, set[int]] = {}  # key -> the keys seen after it in a tie
        self.seen: dict[int, None] = {}  # every key a sorted queue held, in first appearance
        self.pairs = 0
        self._rank: dict[int, int] | None = None

    def for_arm(self, start: object) -> KeyTextOrder:
        return self  # one text order for the whole run, whatever an arm decides

    def landed(self, state: object) -> None:
        pass

    def note(self, arrival: Arrival) -> None:
        if arrival.routing_key is not None and len(self.keys) < self.LIMIT:
            self.keys[arrival.rid] = arrival.routing_key

    def observe(self, record: Pass) -> None:
        """One recorded pass whose order sglang's sort made (``Pass.order`` not None)."""
        try:
            recorded = order_indexes(record.order, len(record.waiting))
        except OrderError:
            return  # a damaged order: the driver's replay reports it; it teaches nothing here
        counts = Counter(k for k in map(self.keys.get, (r.rid for r in record.running)) if k is not None)
        if not counts:
            return  # sglang does not sort then
        previous: tuple[tuple[int, int], int] | None = None
        for i in recorded:
            key = self.keys.get(record.waiting[i].rid)
            if key is None:
                continue  # its text is "", first in its group: it says nothing of the others
            self.seen.setdefault(key, None)
            group = (0, -counts[key]) if key in counts else (1, 0)
            if previous is not None and previous[0] == group and previous[1] != key:
                after = self.before.setdefault(previous[1], set())
                if key not in after and self.pairs < self.LIMIT:
                    after.add(key)
                    self.pairs += 1
                    self._rank = None
            previous = (group, key)

    def rank(self) -> dict[int, int]:
        """key -> its place: a topological order of the observed pairs, ties by first appearance
        (a cycle, which only a damaged trace holds, is broken the same way)."""
        if self._rank is None:
            keys = list(self.seen)
            place = {key: i for i, key in enumerate(keys)}
            pending = dict.fromkeys(keys, 0)
            for after in self.before.values():
                for key in after:
                    pending[key] += 1
            ready = [place[k] for k, n in pending.items() if n == 0]
            heapq.heapify(ready)
            rank: dict[int, int] = {}
            while len(rank) < len(keys):
                if not ready:  # a cycle: the first key not placed yet goes next
                    ready.append(next(place[k] for k in keys if k not in rank))
                key = keys[heapq.heappop(ready)]
                if key in rank:
                    continue
                rank[key] = len(rank)
                for later in self.before.get(key, ()):
                    pending[later] -= 1
                    if pending[later] == 0 and later not in rank:
                        heapq.heappush(ready, place[later])
            self._rank = rank
        return self._rank

    def queue_order(self, waiting: Sequence[WaitingReq]) -> list[int] | None:
        """``Pass.order`` runs putting ``waiting``'s keys in their text's order (stable); None when
        no recorded pass showed any."""
        if not self.before:
            return None
        rank = self.rank()
        unranked = len(rank)
        keys = [self.keys.get(w.rid) for w in waiting]
        return order_runs(sorted(range(len(keys)), key=lambda i: -1 if keys[i] is None else rank.get(keys[i], unranked)))
