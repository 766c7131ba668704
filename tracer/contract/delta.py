"""Format v2's pass deltas: a ``Pass`` as what changed since the pass record before it, and back.

``diff`` (the writer) turns a pass into a ``PassDelta`` against the previous
pass it wrote; ``rebuild`` (the reader) applies one to the previous full
pass. ``rebuild(prev, diff(prev, p)) == p`` field for field: the lists are
runs over the previous lists (schema.py), and every other field is the
pass's own (``COPIED``).

A delta is untrusted input: a run outside the previous list, a literal row
too many or too few, or a rebuilt list longer than ``max_rows`` is a
``DeltaError`` (the reader names the file and offset).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Final

import msgspec

from schedtrace.tracer.contract.schema import ChunkedReq, Pass, PassDelta, RunningReq, WaitingReq

FRESH: Final = -1  # a run's start: take rows from the delta's own list
NEAR: Final = 64  # rows past the end of the last run looked at before looking a row up by rid
STEP_SAMPLE: Final = 5  # running requests whose advance decides the step
# Pass fields a delta carries as they are (the rest are seq, t_ns and the three request lists).
COPIED: Final = (
    "dur_ns", "repeat", "idle_before", "batch_is_full_in", "kv", "req_slots_free", "new_token_ratio",
    "chunked_prefill_size", "candidates", "admitted", "chunk", "new_chunked_rid", "batch_is_full_out", "error",
    "order", "processed_tokens",
)
_rid = attrgetter("rid")
_first = itemgetter(0)  # the rid of a running row's key


class DeltaError(ValueError):
    """A delta that does not apply to the pass before it."""


# --- writing ---


def _match(old: list, j: int, new: list, i: int) -> int:
    """The longest m >= 1 with old[j:j+m] == new[i:i+m], given that old[j] == new[i] (C-speed slice compares)."""
    limit = min(len(old) - j, len(new) - i)
    good, step = 1, 1
    while good < limit:  # gallop: compare only the rows not yet known equal
        upto = min(good + step, limit)
        if old[j + good : j + upto] != new[i + good : i + upto]:
            break
        good, step = upto, step * 2
    else:
        return good
    bad = min(good + step, limit)  # old[j+good:j+bad] differs somewhere: halve it
    while bad - good > 1:
        mid = (good + bad) // 2
        if old[j + good : j + mid] == new[i + good : i + mid]:
            good = mid
        else:
            bad = mid
    return good


def runs(old_keys: list, new_keys: list, rid_of: Callable[[object], str],
         find: Callable[[str], int]) -> tuple[list[int], list[int]]:
    """(runs, the indexes of new rows written in full): copy where a row's key is unchanged.

    A row is looked for where the previous run ended, then a little further
    (the rows admitted from the head), then anywhere (``find``, by rid),
    except past the end of the old list: rows there are arrivals, written in
    full without a look-up (a row written in full is never wrong, only longer).
    """
    out: list[int] = []
    fresh: list[int] = []
    i, n, old_n, hint = 0, len(new_keys), len(old_keys), 0
    while i < n:
        key = new_keys[i]
        j = FRESH
        if hint < old_n:
            if old_keys[hint] == key:
                j = hint
            else:
                try:
                    j = old_keys.index(key, hint + 1, min(hint + NEAR, old_n))
                except ValueError:
                    j = find(rid_of(key))
                    if j != FRESH and old_keys[j] != key:
                        j = FRESH
        if j == FRESH:
            if out and out[-2] == FRESH:
                out[-1] += 1
            else:
                out += (FRESH, 1)
            fresh.append(i)
            i += 1
            continue
        m = _match(old_keys, j, new_keys, i)
        out += (j, m)
        i += m
        hint = j + m
    return out, fresh


# A running row's fields, in order: the key below and ``_rows`` spell them out for speed (tests check).
RUNNING_FIELDS: Final = ("rid", "input_len", "output_len", "max_new_tokens", "ignore_eos")


def _running_key(row: RunningReq, step: int = 0) -> tuple:
    return (row.rid, row.input_len, row.output_len + step, row.max_new_tokens, row.ignore_eos)


def _step(old: list[RunningReq], new: list[RunningReq], find: Callable[[str], int]) -> int:
    """The usual output_len advance of the requests in both batches (one decode step, mostly), from a few.

    Any step is correct (a row that advanced otherwise is written in full); a
    common one keeps the delta short.
    """
    steps: list[int] = []
    for row in new:
        j = find(row.rid)
        if j != FRESH:
            steps.append(row.output_len - old[j].output_len)
            if len(steps) == STEP_SAMPLE:
                break
    return max(steps, key=steps.count) if steps else 0


def _chunked(old: ChunkedReq | None, new: ChunkedReq | None) -> ChunkedReq | int | None:
    if new is None or old is None:
        return new
    return new.prefix_len if msgspec.structs.replace(old, prefix_len=new.prefix_len) == new else new


class _Positions:
    """Where each rid stands in a list of rows, built on the first look-up."""

    __slots__ = ("_rows", "_at")

    def __init__(self, rows: list) -> None:
        self._rows, self._at = rows, None

    def find(self, rid: str) -> int:
        if self._at is None:
            self._at = dict(zip(map(_rid, self._rows), range(len(self._rows))))
        return self._at.get(rid, FRESH)


class Differ:
    """The writer's side: remembers the previous pass to diff the next one against."""

    def __init__(self) -> None:
        self.previous: Pass | None = None

    def reset(self) -> None:
        """The next pass has nothing to diff against (it must be a keyframe)."""
        self.previous = None

    def keep(self, p: Pass) -> None:
        """``p`` is now the pass the next delta is against."""
        self.previous = p

    def diff(self, p: Pass) -> PassDelta:
        """``p`` as a delta against the previous pass (which must be set)."""
        old = self.previous
        assert old is not None
        w_runs, w_fresh = runs(old.waiting, p.waiting, _rid, _Positions(old.waiting).find)
        running_at = _Positions(old.running).find
        step = _step(old.running, p.running, running_at)
        r_runs, r_fresh = runs([_running_key(r, step) for r in old.running], [_running_key(r) for r in p.running],
                               _first, running_at)
        waiting, running = p.waiting, p.running
        return PassDelta(
            p.seq, p.t_ns - old.t_ns, p.dur_ns, p.repeat, p.idle_before,
            w_runs, [waiting[i] for i in w_fresh], r_runs, [running[i] for i in r_fresh], step,
            _chunked(old.chunked, p.chunked), p.batch_is_full_in, p.kv, p.req_slots_free, p.new_token_ratio,
            p.chunked_prefill_size, p.candidates, p.admitted, p.chunk, p.new_chunked_rid, p.batch_is_full_out,
            p.error, p.order, p.processed_tokens,
        )


# --- reading ---


def _rows(old: list, spans: list[int], fresh: list, max_rows: int, what: str, step: int = 0) -> list:
    if not step and not fresh and len(spans) == 2 and 0 <= spans[0] and 0 < spans[1] <= len(old) - spans[0]:
        return old[spans[0] : spans[0] + spans[1]]  # one run, the common case (no longer than ``old``)
    if len(spans) % 2:
        raise DeltaError(f"{what} runs are not (start, count) pairs")
    out: list = []
    taken = 0
    old_n = len(old)
    for k in range(0, len(spans), 2):
        start, count = spans[k], spans[k + 1]
        if count <= 0:
            raise DeltaError(f"{what} run {k // 2} has count {count}")
        if start == FRESH:
            if taken + count > len(fresh):
                raise DeltaError(f"{what} runs take {taken + count} new rows, the delta has {len(fresh)}")
            out += fresh[taken : taken + count]
            taken += count
        elif 0 <= start and start + count <= old_n:
            if step:
                out += [RunningReq(r.rid, r.input_len, r.output_len + step, r.max_new_tokens, r.ignore_eos)
                        for r in old[start : start + count]]
            else:
                out += old[start : start + count]
        else:
            raise DeltaError(f"{what} run {k // 2} copies rows {start}..{start + count} of {old_n}")
        if len(out) > max_rows:
            raise DeltaError(f"{what} list grows past {max_rows} rows")
    if taken != len(fresh):
        raise DeltaError(f"{what} runs leave {len(fresh) - taken} of the delta's new rows unused")
    return out


def rebuild(old: Pass, delta: PassDelta, max_rows: int) -> Pass:
    """The full pass ``delta`` describes, ``old`` being the pass record before it."""
    chunked = delta.chunked
    if type(chunked) is int:
        if old.chunked is None:
            raise DeltaError("chunked refers to the previous pass's chunked request, and it had none")
        chunked = msgspec.structs.replace(old.chunked, prefix_len=chunked)
    waiting: list[WaitingReq] = _rows(old.waiting, delta.waiting_runs, delta.waiting_new, max_rows, "waiting")
    running: list[RunningReq] = _rows(old.running, delta.running_runs, delta.running_new, max_rows, "running",
                                      delta.running_step)
    return Pass(
        delta.seq, old.t_ns + delta.dt_ns, delta.dur_ns, delta.repeat, delta.idle_before, waiting, running,
        chunked, delta.batch_is_full_in, delta.kv, delta.req_slots_free, delta.new_token_ratio,
        delta.chunked_prefill_size, delta.candidates, delta.admitted, delta.chunk, delta.new_chunked_rid,
        delta.batch_is_full_out, delta.error, delta.order, delta.processed_tokens,
    )
