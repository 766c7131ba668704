"""routing-key ties in replay: sglang breaks them by a key's text, which a trace holds only as a keyed id.

``SchedulePolicy._sort_by_routing_key`` sorts the queue by (whether the running
batch lacks the key, minus its count there, the key's text). Keys of equal
count, and every key the running batch lacks, fall to the text, whose order
the keyed ids (docs/trace-format.md) do not keep. For one ``calc_priority``,
``keys_renamed`` names each key so that its text sorts as the key first
appears in the pass's recorded queue order (``Pass.order``); the rest (the
counts, the groups, the stable order of requests sharing a key) is
re-derived by sglang's own sort and checked against the recording.
Pure: no sglang, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

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
