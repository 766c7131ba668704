"""Format v2's pass deltas: a ``Pass`` as what changed since the pass record before it, and back.

``diff`` (the writer) turns a pass into a ``PassDelta`` against the previous
pass it wrote; ``rebuild`` (the reader) applies one to the previous full
pass. ``rebuild(prev, diff(prev, p)) == p`` field for field: the lists are
runs over the previous lists (schema.py), and every other field is the
pass's own (``COPIED``).

A delta is untrusted input: a run outside the previous list, a literal row
too many or too few, a list that copies more rows than the previous list
held (a list grows only by its new rows, so a few bytes cannot double it),
a rebuilt list longer than ``max_rows``, or a rebuilt ``t_ns`` or
``output_len`` that no record could hold is a ``DeltaError`` (the reader
names the file and offset).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Final

import msgspec

from schedtrace.tracer.contract.names import COPIES_PER_BUILT_ROW
from schedtrace.tracer.contract.schema import ChunkedReq, Pass, PassDelta, RunningReq, WaitingReq

FRESH: Final = -1  # a run's start: take rows from the delta's own list
NEAR: Final = 64  # rows past the end of the last run looked at before looking a row up by rid
STEP_SAMPLE: Final = 5  # running requests whose advance decides the step
# What a msgpack int can hold: a rebuilt number outside it could not have been written (nor written again).
INT_MIN: Final = -(1 << 63)
INT_MAX: Final = (1 << 64) - 1
# Pass fields a delta carries as they are (the rest are seq, t_ns and the three request lists).
COPIED: Final = (
    "dur_ns", "repeat", "idle_before", "batch_is_full_in", "kv", "req_slots_free", "new_token_ratio",
    "chunked_prefill_size", "candidates", "admitted", "chunk", "new_chunked_rid", "batch_is_full_out", "error",
    "order", "processed_tokens", "released", "forward_ct",
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
            p.error, p.order, p.processed_tokens, p.released, p.forward_ct,
        )


# --- reading ---


def plan(old_n: int, spans: list[int], fresh_n: int, max_rows: int, what: str) -> list[tuple[int, int]]:
    """A list's runs checked against the list before it (``old_n`` rows) and the delta's ``fresh_n`` new rows."""
    if len(spans) % 2:
        raise DeltaError(f"{what} runs are not (start, count) pairs")
    out: list[tuple[int, int]] = []
    taken = copied = total = 0
    for k in range(0, len(spans), 2):
        start, count = spans[k], spans[k + 1]
        if count <= 0:
            raise DeltaError(f"{what} run {k // 2} has count {count}")
        if start == FRESH:
            taken += count
            if taken > fresh_n:
                raise DeltaError(f"{what} runs take {taken} new rows, the delta has {fresh_n}")
        elif not (0 <= start and start + count <= old_n):
            raise DeltaError(f"{what} run {k // 2} copies rows {start}..{start + count} of {old_n}")
        else:
            copied += count
            if copied > old_n:  # the writer copies each row once: a list grows only by its new rows
                raise DeltaError(f"{what} list grows past its {old_n} rows by copies (runs copy {copied})")
        total += count
        if total > max_rows:
            raise DeltaError(f"{what} list grows past {max_rows} rows")
        out.append((start, count))
    if taken != fresh_n:
        raise DeltaError(f"{what} runs leave {fresh_n - taken} of the delta's new rows unused")
    return out


def rebuild_cost(delta: PassDelta) -> int:
    """What rebuilding ``delta`` makes a reader do, in row copies: a stepped running row is built anew
    (``COPIES_PER_BUILT_ROW`` copies), any other copied row is one. New rows are paid for by their bytes."""
    running = _copied(delta.running_runs)
    return _copied(delta.waiting_runs) + (running * COPIES_PER_BUILT_ROW if delta.running_step else running)


def _copied(spans: list[int]) -> int:
    """The rows a list's runs copy from the list before it."""
    return sum(count for start, count in zip(spans[::2], spans[1::2]) if start != FRESH)


def _rows(old: list, spans: list[int], fresh: list, max_rows: int, what: str, step: int = 0) -> list:
    if not step and not fresh and len(spans) == 2 and 0 <= spans[0] and 0 < spans[1] <= len(old) - spans[0]:
        return old[spans[0] : spans[0] + spans[1]]  # one run, the common case (no longer than ``old``)
    out: list = []
    taken = 0
    for start, count in plan(len(old), spans, len(fresh), max_rows, what):
        if start == FRESH:
            out += fresh[taken : taken + count]
            taken += count
        elif step:
            out += _stepped(old[start : start + count], step)
        else:
            out += old[start : start + count]
    return out


_output_len = attrgetter("output_len")


def _in_range(lo: int, hi: int, what: str) -> None:
    if not (INT_MIN <= lo and hi <= INT_MAX):
        raise DeltaError(f"{what} past what a record can hold")


def _stepped(rows: list[RunningReq], step: int) -> list[RunningReq]:
    """``rows`` with ``step`` added to each output_len, which must stay a number a record can hold."""
    if rows:
        _in_range(min(map(_output_len, rows)) + step, max(map(_output_len, rows)) + step,
                  f"running step {step} takes an output_len")
    return [RunningReq(r.rid, r.input_len, r.output_len + step, r.max_new_tokens, r.ignore_eos) for r in rows]


def _next(old_t_ns: int, old_chunked: ChunkedReq | None, delta: PassDelta) -> tuple[int, ChunkedReq | None]:
    """The rebuilt pass's t_ns and chunked request."""
    t_ns = old_t_ns + delta.dt_ns
    _in_range(t_ns, t_ns, f"dt_ns {delta.dt_ns} takes t_ns")
    chunked = delta.chunked
    if type(chunked) is int:
        if old_chunked is None:
            raise DeltaError("chunked refers to the previous pass's chunked request, and it had none")
        chunked = msgspec.structs.replace(old_chunked, prefix_len=chunked)
    return t_ns, chunked


def _made(delta: PassDelta, t_ns: int, waiting: list[WaitingReq], running: list[RunningReq],
          chunked: ChunkedReq | None) -> Pass:
    return Pass(
        delta.seq, t_ns, delta.dur_ns, delta.repeat, delta.idle_before, waiting, running,
        chunked, delta.batch_is_full_in, delta.kv, delta.req_slots_free, delta.new_token_ratio,
        delta.chunked_prefill_size, delta.candidates, delta.admitted, delta.chunk, delta.new_chunked_rid,
        delta.batch_is_full_out, delta.error, delta.order, delta.processed_tokens, delta.released,
        delta.forward_ct,
    )


def rebuild(old: Pass, delta: PassDelta, max_rows: int) -> Pass:
    """The full pass ``delta`` describes, ``old`` being the pass record before it."""
    t_ns, chunked = _next(old.t_ns, old.chunked, delta)
    waiting: list[WaitingReq] = _rows(old.waiting, delta.waiting_runs, delta.waiting_new, max_rows, "waiting")
    running: list[RunningReq] = _rows(old.running, delta.running_runs, delta.running_new, max_rows, "running",
                                      delta.running_step)
    return _made(delta, t_ns, waiting, running, chunked)


class _Indexed:
    """A list as positions into every row met on the walk (``rows``): a copied run is an array slice."""

    __slots__ = ("rows", "at")

    def __init__(self, rows: list) -> None:
        self.rows = list(rows)
        self.at = array("q", range(len(rows)))

    def apply(self, spans: list[int], fresh: list, max_rows: int, what: str) -> None:
        at = self.at
        if not fresh and len(spans) == 2 and spans[0] == 0 and spans[1] == len(at):
            return  # the whole list again: nothing to copy
        first = len(self.rows)
        self.rows += fresh
        out = array("q")
        taken = 0
        for start, count in plan(len(at), spans, len(fresh), max_rows, what):
            if start == FRESH:
                out.extend(range(first + taken, first + taken + count))
                taken += count
            else:
                out += at[start : start + count]
        self.at = out

    def now(self) -> list:
        rows = self.rows
        return [rows[i] for i in self.at]


class Walk:
    """Deltas applied one after another without building the passes between (a cold ``pass_at``).

    A list is kept as positions into the rows met so far, so a copied run
    costs an array slice, not a reference per row; a running row keeps the
    object it was read as and its output_len less the steps before it
    (``owed``), and the rows are built once, for the pass asked for. The
    checks are ``rebuild``'s.
    """

    def __init__(self, p: Pass, max_rows: int) -> None:
        self.max_rows = max_rows
        self.seq, self.t_ns, self.chunked = p.seq, p.t_ns, p.chunked
        self.waiting, self.running = _Indexed(p.waiting), _Indexed(p.running)
        self.owed = list(map(_output_len, p.running))  # by row met, as running.rows
        self.steps = 0
        # bounds of every owed value met (a superset of those alive): the range check is exact only if they fail
        self.lo, self.hi = min(self.owed, default=0), max(self.owed, default=0)
        self.delta: PassDelta | None = None

    def apply(self, delta: PassDelta) -> None:
        t_ns, chunked = _next(self.t_ns, self.chunked, delta)
        self.waiting.apply(delta.waiting_runs, delta.waiting_new, self.max_rows, "waiting")
        steps = self.steps + delta.running_step
        new_owed = [r.output_len - steps for r in delta.running_new]
        self.running.apply(delta.running_runs, delta.running_new, self.max_rows, "running")
        self.owed += new_owed
        self.lo, self.hi = min(self.lo, min(new_owed, default=self.lo)), max(self.hi, max(new_owed, default=self.hi))
        if self.running.at and not (INT_MIN <= self.lo + steps and self.hi + steps <= INT_MAX):
            alive = [self.owed[i] for i in self.running.at]
            self.lo, self.hi = min(alive), max(alive)
            _in_range(self.lo + steps, self.hi + steps, f"running step {delta.running_step} takes an output_len")
        self.seq, self.t_ns, self.chunked, self.steps, self.delta = delta.seq, t_ns, chunked, steps, delta

    def rebuilt(self) -> Pass:
        """The pass of the last delta applied."""
        steps, delta, rows, owed = self.steps, self.delta, self.running.rows, self.owed
        assert delta is not None
        running = []
        for i in self.running.at:
            r, o = rows[i], owed[i] + steps
            running.append(r if r.output_len == o else RunningReq(r.rid, r.input_len, o, r.max_new_tokens,
                                                                     r.ignore_eos))
        return _made(delta, self.t_ns, self.waiting.now(), running, self.chunked)
