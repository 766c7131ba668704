"""Real sglang ``Req`` objects for the requests of a recorded pass.

Traces hold lengths, never token ids: each request gets dummy ids of its
recorded lengths (``TokenSource``). Building a real ``Req`` (~30 us)
dominates a pass, so ``ReqCache`` reuses Reqs across passes where sglang
itself keeps the same object alive:

* running requests are only read before admission ends; one Req per rid
  (rebuilt if its input_len, max_new_tokens or ignore_eos differ) gets the
  pass's output length set in place, decode's one token a pass appended;
* a waiting request lives in the real queue across passes and every pass
  re-derives its admission state (``init_next_round_input``), so a Req
  built for an identical row is reused until a pass admits it (or the
  pass raises); admitted Reqs were changed by admission and are dropped.

Token ids come from one ``TokenSource`` for the cache's life. A request
whose arrival recorded prefix ids gets, for each block, one token value per
distinct id (``Arrival.prefix_ids``), so requests share exactly the blocks
they shared in the recording and sglang's own radix trees (the in-batch
check's, dfs-weight's) match them as the server did; the rest of a request
(its output, and any request without ids) is one token of its own, shared
with no other request.
"""

from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec
import numpy as np

from schedtrace.replay.sglang_env import ensure_sglang_importable

ensure_sglang_importable()

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.prefix_ids import PREFIX_ID_BYTES, id_count
from schedtrace.tracer.contract.schema import Arrival, ChunkedReq, Pass, RunningReq, WaitingReq

_SEVEN_BYTES = np.uint64((1 << 56) - 1)  # a block's value: its id's first 7 bytes

# Row index given to the in-flight chunked request: it already holds a
# req_to_token row; the number itself is never read.
_HELD_ROW = 0


class Arrived(msgspec.Struct):
    """What one live request's ``Arrival`` recorded beyond its row."""

    t_ns: int  # when it (last) joined the queue
    prefix_ids: bytes = b""  # at most one id per block of its recorded input
    stamp: int = 0  # hrrn's arrival stamp (Arrival.processed_tokens)
    routing: str | None = None  # its routing key's id
    priority: int | None = None


@dataclass
class ArrivalBook:
    """What each live request's ``Arrival`` recorded beyond its row (``Arrived``), from ``note``
    until its ``Finish`` (``forget``).

    A trace is untrusted: ids past a request's recorded input are dropped (no token of it reads
    them), and past ``LIMIT`` live requests the oldest entry goes (a request whose finish was
    lost, or a trace that never finishes any), so a hostile trace cannot grow the book without bound."""

    block: int  # Header.prefix_block; 0: the trace has no ids
    live: dict[str, Arrived] = field(default_factory=dict)

    LIMIT: ClassVar[int] = 1 << 18  # live requests kept: far more than a scheduler queues

    def note(self, arrival: Arrival) -> None:
        ids = arrival.prefix_ids
        if self.block > 0 and ids:
            ids = ids[: id_count(max(arrival.input_len, 0), self.block) * PREFIX_ID_BYTES]
        else:
            ids = b""
        live = self.live
        live.pop(arrival.rid, None)  # a rid noted again is the newest
        if len(live) >= self.LIMIT:
            del live[next(iter(live))]
        stamp = arrival.processed_tokens
        live[arrival.rid] = Arrived(
            arrival.t_ns, ids, 0 if stamp is None else stamp,
            None if arrival.routing_key is None else str(arrival.routing_key), arrival.priority)

    def requeued(self, rid: str, t_ns: int) -> None:
        """A retracted request joined the queue again."""
        entry = self.live.get(rid)
        if entry is not None:
            entry.t_ns = t_ns

    def forget(self, rid: str) -> None:
        self.live.pop(rid, None)

    def prefix_ids(self, rid: str) -> bytes:
        entry = self.live.get(rid)
        return b"" if entry is None else entry.prefix_ids

    def stamp(self, req: Req) -> Req:
        """Set what the arrival recorded on a fresh ``Req``."""
        entry = self.live.get(req.rid)
        if entry is None:
            req.arrival_processed_tokens, req.routing_key = 0, None
        else:
            req.arrival_processed_tokens, req.routing_key = entry.stamp, entry.routing
        return req


@dataclass
class TokenSource:
    """Dummy token ids: per block of recorded prefix ids one value per distinct id, else
    one value per request, so requests share the prefixes they shared and no others.

    Traces hold lengths, never token ids; a value of its own per request keeps
    the waiting-queue prefix matching of cache-aware policies from inventing
    shared prefixes the recording never had. A block's value is its id's first
    7 bytes past ``vocab``, so it never meets a request's own value and needs
    no table.
    """

    vocab: int = 30000
    ids: dict[str, int] = field(default_factory=dict)
    book: ArrivalBook = field(default_factory=lambda: ArrivalBook(0))
    # (rid, n) -> (the prefix ids they were made from, the tokens): a Req is rebuilt each time a pass
    # admits it, and its prompt is the same each time; bounded by the tokens held.
    _inputs: dict[tuple[str, int], tuple[bytes, array]] = field(default_factory=dict, repr=False)
    _inputs_held: int = 0
    INPUT_TOKENS_HELD: ClassVar[int] = 1 << 22  # 32 MiB of int64 tokens

    def token_for(self, rid: str) -> int:
        token = self.ids.get(rid)
        if token is None:
            token = self.ids[rid] = 1 + len(self.ids) % (self.vocab - 1)
        return token

    def tokens(self, rid: str, n: int) -> array:
        return array("q", [self.token_for(rid)]) * n

    def input_tokens(self, rid: str, n: int) -> array:
        """The ``n`` input tokens of ``rid``: its prefix blocks' values, then its own value (a copy
        of its own: sglang may change a Req's)."""
        data = self.book.prefix_ids(rid)
        if not data:
            return self.tokens(rid, n)
        made = self._inputs.get((rid, n))
        if made is not None and made[0] is data:
            return made[1][:]
        out = self._build_input(rid, n, data)
        if n <= self.INPUT_TOKENS_HELD:
            if self._inputs_held + n > self.INPUT_TOKENS_HELD:
                self._inputs.clear()
                self._inputs_held = 0
            self._inputs[rid, n] = (data, out)
            self._inputs_held += n
        return out[:]

    def _build_input(self, rid: str, n: int, data: bytes) -> array:
        block = self.book.block
        used = data[: -(-n // block) * PREFIX_ID_BYTES]
        used += bytes(-len(used) % PREFIX_ID_BYTES)  # a torn last id reads as its bytes, zero-padded
        # Each id's first 7 bytes, little-endian, past vocab, repeated over its block: vectorised,
        # since a 24k-token prompt has 1,500 blocks and a Req is rebuilt each time a pass admits it.
        values = (np.frombuffer(used, dtype="<u8") & _SEVEN_BYTES).astype(np.int64) + self.vocab
        out = array("q")
        out.frombytes(np.repeat(values, block)[:n].tobytes())
        if len(out) < n:
            out.extend(array("q", [self.token_for(rid)]) * (n - len(out)))
        return out


def _make_req(tokens: TokenSource, rid: str, input_len: int, output_len: int, max_new: int, ignore_eos: bool,
              priority: int | None = None) -> Req:
    if input_len < 0 or output_len < 0 or max_new < 0:
        raise ReplayStateError(f"request {rid!r}: negative length in the record")
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    req = Req(rid, "", tokens.input_tokens(rid, input_len), params, priority=priority)
    if output_len:
        req.output_ids = tokens.tokens(rid, output_len)  # an array("q"), as sglang keeps it
    return req


def waiting_req(tokens: TokenSource, w: WaitingReq, order: int) -> Req:
    req = tokens.book.stamp(_make_req(tokens, w.rid, w.input_len, w.output_len, w.max_new_tokens, w.ignore_eos, w.priority))
    # Queue order at pass entry is the arrival order the policies tie-break on.
    req.time_stats.wait_queue_entry_time = float(order)
    if w.output_len:
        req.is_retracted = True
        req.retracted_stain = True
    return req


def running_req(tokens: TokenSource, r: RunningReq) -> Req:
    book = tokens.book
    entry = book.live.get(r.rid)
    req = book.stamp(_make_req(tokens, r.rid, r.input_len, r.output_len, r.max_new_tokens, r.ignore_eos,
                               None if entry is None else entry.priority))
    # Priority preemption picks the newest of the lowest priority: the time it joined the queue.
    req.time_stats.wait_queue_entry_time = (0 if entry is None else entry.t_ns) / 1e9
    req.kv.req_pool_idx = _HELD_ROW
    return req


def chunked_req(tokens: TokenSource, c: ChunkedReq) -> Req:
    if not 0 <= c.prefix_len <= c.input_len + c.output_len:
        raise ReplayStateError(f"chunked request {c.rid!r}: prefix {c.prefix_len} outside its {c.input_len} tokens")
    req = _make_req(tokens, c.rid, c.input_len, c.output_len, c.max_new_tokens, c.ignore_eos)
    req.refresh_fill_ids()
    req.prefix_len = c.prefix_len
    req.extend_end = c.prefix_len
    req.kv.req_pool_idx = _HELD_ROW
    req.kv.cache_protected_len = c.prefix_len
    return req


def batch_defaults(cls: type) -> dict[str, Any]:
    """Every field default of the dataclass ``cls``: a batch built from these is the one its
    ``__init__`` builds (no field of ScheduleBatch has a factory), at a fraction of the cost."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} has a default factory")  # a newer sglang: build it per pass
        out[f.name] = None if f.default is dataclasses.MISSING else f.default
    return out


class ReqCache:
    """Reqs reused across passes (see the module docstring)."""

    LIMIT = 8192  # cached Reqs before the cache starts over

    def __init__(self, book: ArrivalBook | None = None) -> None:
        self.book = book if book is not None else ArrivalBook(0)
        self.reset()

    def reset(self) -> None:
        self.tokens = TokenSource(book=self.book)
        self._running: dict[str, tuple[int, int, bool, Req, int]] = {}  # rid -> _new_running's entry
        self._waiting: dict[tuple, Req] = {}

    def running_reqs(self, p: Pass) -> list[Req]:
        """The running Reqs of ``p``; take its waiting ones next (``waiting_reqs``), if at all."""
        if len(self._waiting) + len(self._running) > self.LIMIT:
            self.reset()
        cache, out = self._running, []
        for r in p.running:  # one loop, no call per row: this runs for every running request of every pass
            entry = cache.get(r.rid)
            if entry is None or entry[0] != r.input_len or entry[1] != r.max_new_tokens or entry[2] != r.ignore_eos:
                out.append(self._new_running(r))
                continue
            req = entry[3]
            output = req.output_ids  # decode grew it since the last pass: resize in place
            grow = r.output_len - len(output)
            if grow == 1:  # most passes: one decoded token
                output.append(entry[4])
            elif grow:
                self._resize(output, r)
            out.append(req)
        return out

    def waiting_reqs(self, p: Pass) -> list[Req]:
        """The waiting Reqs of ``p``, in its order; call ``release`` after the pass."""
        return [self._waiting_req(w, n) for n, w in enumerate(p.waiting)]

    def _new_running(self, r: RunningReq) -> Req:
        req = running_req(self.tokens, r)
        # (the row's fixed fields, its Req, the token its output grows by)
        self._running[r.rid] = (r.input_len, r.max_new_tokens, r.ignore_eos, req, self.tokens.token_for(r.rid))
        return req

    def _resize(self, output: array, r: RunningReq) -> None:
        grow = r.output_len - len(output)
        if grow > 0:
            output.extend(self.tokens.tokens(r.rid, grow))
        else:
            del output[r.output_len :]

    def _waiting_req(self, w: WaitingReq, order: int) -> Req:
        key = msgspec.structs.astuple(w)
        req = self._waiting.get(key)
        if req is None:
            req = self._waiting[key] = waiting_req(self.tokens, w, order)
        else:
            req.time_stats.wait_queue_entry_time = float(order)
        return req

    def drop_running(self, rid: str) -> None:
        """Forget the running Req of ``rid`` (preemption reset it)."""
        self._running.pop(rid, None)

    def release(self, p: Pass, waiting: list[Req] | None, admitted_reqs: list[Any] | None) -> None:
        """Drop every Req this pass changed beyond re-derivable state (``waiting``: the pass's
        waiting Reqs in its order, None if it never took them; ``admitted_reqs`` None: it raised)."""
        if waiting is None or (admitted_reqs is not None and not admitted_reqs):
            return
        changed = None if admitted_reqs is None else {id(r) for r in admitted_reqs}
        for w, req in zip(p.waiting, waiting):
            if changed is None or id(req) in changed:
                self._waiting.pop(msgspec.structs.astuple(w), None)
