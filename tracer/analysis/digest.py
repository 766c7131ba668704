"""What ranks compare: the facts of a pass, its place on the pass clock, and where two values differ.

Pure: no file access and no sglang. ``schedtrace.tracer.analysis.ranks``
uses these to compare the ranks of one run (docs/ranks.md).

The pass clock counts every scheduler pass of a rank: each pass record with
its folded repeats, and the idle passes between records (``idle`` records;
``idle_before`` in traces that have none). Ranks that run in lockstep show
the same pass at the same clock even where the recorder folded repeats
differently (folding stops on a timer, so where it splits is timing) or
where one rank was idle.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import msgspec

from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import ValueGroup
from schedtrace.tracer.contract.schema import Clock, Idle, Loss, Pass, Record

# Every Pass field is in exactly one of these (tests/test_ranks.py checks), so
# a new schema field must be placed before ranks compares it or not.
# Differ between ranks by nature (forward_ct: a folded record's first pass's, and ranks fold apart).
TIMING_FIELDS: Final = ("seq", "t_ns", "dur_ns", "repeat", "idle_before", "forward_ct")
INPUT_FIELDS: Final = ("waiting", "running", "chunked", "batch_is_full_in", "kv", "req_slots_free",
                       "new_token_ratio", "chunked_prefill_size", "processed_tokens")
OUTPUT_FIELDS: Final = ("candidates", "admitted", "chunk", "new_chunked_rid", "batch_is_full_out", "error",
                        "order", "released")

_FIELDS = Pass.__struct_fields__
_CONTENT = operator.itemgetter(*(_FIELDS.index(f) for f in INPUT_FIELDS + OUTPUT_FIELDS))
_N_INPUTS: Final = len(INPUT_FIELDS)
MAX_PATHS: Final = 6  # differing fields reported per pair of passes
MAX_VALUE_CHARS: Final = 200  # a value longer than this as JSON is cut to a string
SHORT_LIST: Final = 4  # lists of different lengths up to this long are shown whole, longer ones by length

FieldPath = tuple[str | int, ...]


def content_key(p: Pass) -> tuple:
    """The inputs then the outputs of ``p``, timing left out: equal keys, equal passes."""
    return _CONTENT(msgspec.structs.astuple(p))


def inputs_of(key: tuple) -> tuple:
    return key[:_N_INPUTS]


class Segment(NamedTuple):
    """Scheduler passes [start, stop) of one rank: one pass record (with its repeats), or idle."""

    start: int
    stop: int
    record: Pass | None  # None: idle passes (nothing waiting, no chunked request)
    t_ns: int


@dataclass
class ClockState:
    """What a clock stream learnt about its rank by the time it ended."""

    now: int = 0  # scheduler passes so far
    pass_records: int = 0
    lost: int = 0  # records the writer dropped
    lost_at: int | None = None  # clock at the first loss: later passes may be missing
    wall_offset: int = 0  # wall_ns - t_ns: the header's start, then the latest clock record's
    ended: bool = False


def clock_segments(records: Iterable[tuple[int, Record]], state: ClockState) -> Iterator[Segment]:
    """A rank's records as consecutive segments of its pass clock, from 0, in file order."""
    idle_since_pass = 0
    for _, record in records:
        kind = type(record)
        if kind is Pass:
            if record.idle_before > 0 and not idle_since_pass:  # a trace without idle records
                yield Segment(state.now, state.now + record.idle_before, None, record.t_ns)
                state.now += record.idle_before
            idle_since_pass = 0
            start = state.now
            state.now += max(record.repeat, 1)
            state.pass_records += 1
            yield Segment(start, state.now, record, record.t_ns)
        elif kind is Idle and record.count > 0:
            idle_since_pass += record.count
            yield Segment(state.now, state.now + record.count, None, record.t_ns)
            state.now += record.count
        elif kind is Clock:
            state.wall_offset = record.wall_ns - record.t_ns
        elif kind is Loss:
            state.lost += record.count
            if state.lost_at is None:
                state.lost_at = state.now
    state.ended = True


# --- where two values differ ---------------------------------------------------


def merged(groups: list[ValueGroup]) -> list[ValueGroup]:
    """``groups`` with equal values joined, in first-seen order."""
    out: list[ValueGroup] = []
    for g in groups:
        same = next((o for o in out if o.value == g.value), None)
        if same is None:
            out.append(ValueGroup(ranks=list(g.ranks), value=g.value))
        else:
            same.ranks.extend(g.ranks)
    return out


def diff_paths(a: Any, b: Any, path: FieldPath = (), limit: int = MAX_PATHS) -> list[FieldPath]:
    """Paths to the leaves where ``a`` and ``b`` differ: every struct field, the first differing list item."""
    out: list[FieldPath] = []
    _walk(a, b, path, out, limit)
    return out


def _walk(a: Any, b: Any, path: FieldPath, out: list[FieldPath], limit: int) -> None:
    if len(out) >= limit or a == b:
        return
    if isinstance(a, msgspec.Struct) and type(a) is type(b):
        for name in a.__struct_fields__:
            _walk(getattr(a, name), getattr(b, name), (*path, name), out, limit)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b) and max(len(a), len(b)) <= SHORT_LIST:
            out.append(path)
            return
        if len(a) != len(b):
            out.append((*path, "len"))
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                _walk(x, y, (*path, i), out, limit)
                break
    else:
        out.append(path)


def value_at(value: Any, path: FieldPath) -> Any:
    """The part of ``value`` a path names; ``"len"`` is a list's length; None where it has none."""
    for step in path:
        if step == "len" and isinstance(value, (list, tuple)):
            return len(value)
        if isinstance(step, int):
            if not isinstance(value, (list, tuple)) or step >= len(value):
                return None
            value = value[step]
        elif isinstance(value, msgspec.Struct):
            value = getattr(value, step)
        else:
            return None
    return value


def path_text(path: FieldPath) -> str:
    """``("waiting", 3, "prefix_len")`` -> ``waiting[3].prefix_len``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def shown_value(value: Any) -> Any:
    """``value`` as JSON data (lists, dicts, scalars), or its JSON cut to a string when long
    (traces are untrusted: a report line stays bounded)."""
    text = msgspec.json.encode(value)
    if len(text) <= MAX_VALUE_CHARS:
        return msgspec.json.decode(text)
    return text[: MAX_VALUE_CHARS - 1].decode("utf-8", "replace") + "…"


def pass_diff_paths(a: Pass, b: Pass) -> tuple[list[FieldPath], list[FieldPath]]:
    """(input paths, output paths) where two passes differ; outputs as the recorded decision first."""
    inputs = [p for f in INPUT_FIELDS for p in diff_paths(getattr(a, f), getattr(b, f), (f,))][:MAX_PATHS]
    outputs = diff_paths(recorded_decision(a), recorded_decision(b), ("decision",))
    if not outputs:  # same decision, other outputs differ (candidates, admitted prefixes)
        outputs = [p for f in OUTPUT_FIELDS for p in diff_paths(getattr(a, f), getattr(b, f), (f,))]
    return inputs, outputs[:MAX_PATHS]


def pass_value(p: Pass, path: FieldPath) -> Any:
    """The value a path of ``pass_diff_paths`` names in ``p``."""
    if path[0] == "decision":
        return value_at(recorded_decision(p), path[1:])
    return value_at(p, path)
