"""The what-if grid: which server arguments a sweep may set, and how a cell's
configuration changes a closed loop's input.

Pure: no sglang, so ``schedtrace sweep`` checks every ``--set`` before the
12 s import. ``apply_config`` rewrites the header the driver is built from
(``PassDriver`` reads the server arguments there) and the start state the
loop evolves (request slots, the KV pool):

* ``max_running_requests``: the scheduler's cap and the request pool
  (sglang sizes ``req_to_token_pool`` from it): the slots change by the
  difference, free slots at the start too;
* ``chunked_prefill_size``: the chunk every pass is decided with (-1: off);
* ``schedule_policy``: the waiting queue's order;
* ``max_total_tokens``: the full KV pool; free KV at the start changes by
  the difference (full-pool traces only: a hybrid pool's sizes are its own).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Final, Union

import msgspec

from schedtrace.replay.loop.input import LoopInput
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.schema import Header

Value = Union[int, str]
Config = dict[str, Value]

# sglang 0.5.23's policies (schedule_policy.CacheAwarePolicy, CacheAgnosticPolicy) a loop can run:
POLICIES: Final = ("fcfs", "lof", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
# and those it cannot, with why (tests/test_sweep.py holds both lists to sglang's enums).
REFUSED_POLICIES: Final = {
    "random": "orders the queue at random: a sweep must be deterministic",
    "routing-key": "breaks ties by the routing keys' text, which traces hold only as keyed ids",
}
# key -> short column name (the table and the heatmap).
KEYS: Final = {
    "max_running_requests": "running",
    "chunked_prefill_size": "chunk",
    "schedule_policy": "policy",
    "max_total_tokens": "kv",
}
CHUNKING_OFF: Final = -1  # sglang's chunked_prefill_size for no chunking


def _int_value(key: str, text: str, *, off: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--set {key}: {text!r} is not an integer") from None
    if value < 1 and value != off:
        extra = f" (or {off}: off)" if off is not None else ""
        raise UsageError(f"--set {key}: {value} must be at least 1{extra}")
    return value


def parse_value(key: str, text: str) -> Value:
    """One value of ``key``, checked."""
    if key == "schedule_policy":
        if text in REFUSED_POLICIES:
            raise UsageError(f"--set schedule_policy: {text} {REFUSED_POLICIES[text]}")
        if text not in POLICIES:
            raise UsageError(f"--set schedule_policy: {text!r} is not one of {', '.join(POLICIES)}")
        return text
    return _int_value(key, text, off=CHUNKING_OFF if key == "chunked_prefill_size" else None)


def parse_set(text: str) -> tuple[str, list[Value]]:
    """``KEY=V1,V2,...`` as the key and its values."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE[,VALUE...]")
    if key not in KEYS:
        raise UsageError(f"--set {key!r}: not a sweep key (one of {', '.join(KEYS)})")
    parts = [v.strip() for v in values.split(",")]
    if not any(parts) or "" in parts:
        raise UsageError(f"--set {key}: an empty value in {values!r}")
    parsed = [parse_value(key, v) for v in parts]
    if len(set(parsed)) != len(parsed):
        raise UsageError(f"--set {key}: a value given twice in {values!r}")
    return key, parsed


def parse_grid(sets: list[str] | tuple[str, ...]) -> dict[str, list[Value]]:
    """The grid of ``--set`` options, keys in the order given."""
    if not sets:
        raise UsageError("give at least one --set KEY=VALUE[,VALUE...]")
    grid: dict[str, list[Value]] = {}
    for text in sets:
        key, values = parse_set(text)
        if key in grid:
            raise UsageError(f"--set {key}: given twice; list its values in one --set")
        grid[key] = values
    return grid


def grid_cells(grid: dict[str, list[Value]]) -> list[Config]:
    """Every combination, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def recorded_config(header: Header, keys=KEYS) -> Config:
    """What the trace's server ran with, for ``keys`` (``max_running_requests``
    unset: the request pool's size; ``max_total_tokens`` unset: 0, unknown)."""
    args = header.server_args
    values: Config = {
        "max_running_requests": capacity.max_running(header),
        "chunked_prefill_size": args.chunked_prefill_size if args.chunked_prefill_size else CHUNKING_OFF,
        "schedule_policy": args.schedule_policy,
        "max_total_tokens": args.max_total_tokens or 0,
    }
    return {k: values[k] for k in keys}


def apply_config(loop: LoopInput, config: Config) -> LoopInput:
    """``loop`` as if its server had run with ``config`` (docs/sweep.md)."""
    header = loop.header
    args = header.server_args
    initial = loop.initial.copy()
    start = loop.start
    slots = header.max_req_slots
    changes: dict[str, Value | None] = {}
    if "max_running_requests" in config:
        new = int(config["max_running_requests"])
        delta = new - capacity.max_running(header)
        initial.req_slots_free += delta
        if initial.req_slots_free < 0 or (slots and slots + delta < 1):
            held = len(initial.running) + (initial.chunked is not None)
            raise UsageError(f"max_running_requests={new}: the start pass already runs {held} requests")
        slots = slots + delta if slots else 0
        changes["max_running_requests"] = new
    if "chunked_prefill_size" in config:
        size = int(config["chunked_prefill_size"])
        changes["chunked_prefill_size"] = size
        start = msgspec.structs.replace(start, chunked_prefill_size=size if size > 0 else None)
    if "schedule_policy" in config:
        changes["schedule_policy"] = str(config["schedule_policy"])
    if "max_total_tokens" in config:
        new = int(config["max_total_tokens"])
        if header.pools is not None and (header.is_hybrid_swa or header.is_hybrid_mamba):
            raise UsageError("max_total_tokens: a hybrid (SWA/mamba) trace's pools are sized in its header, "
                             "not by max_total_tokens")
        old = args.max_total_tokens or initial.pool_totals()["full"]
        held = old - initial.free - initial.evictable
        initial.free += new - old
        if initial.free < 0:  # a smaller pool would have cached less
            initial.evictable += initial.free
            initial.free = 0
        if initial.evictable < 0:
            raise UsageError(f"max_total_tokens={new}: the start pass's requests already hold {held} tokens")
        changes["max_total_tokens"] = new
    header = msgspec.structs.replace(header, server_args=msgspec.structs.replace(args, **changes),
                                     max_req_slots=slots)
    return replace(loop, header=header, start=start, initial=initial)
