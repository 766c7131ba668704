"""The workload a trace recorded: one request per arrival, as a re-drive or a workload file needs it.

Pure: ``WorkloadBuilder`` is fed the records of one rank or several (each
record with its wall time, so DP ranks share one timeline) and gives the
requests in arrival order. A request seen on several ranks (TP ranks record
the same arrivals) is kept once, at its earliest arrival.

``hash_ids`` are the trace's prefix ids (``Arrival.prefix_ids``, one per
block of ``Header.prefix_block`` tokens) numbered 0, 1, 2, ... in the order
they are first seen, so requests that shared a prefix block share its
number. A trace without prefix ids gives every block a number of its own
(``shared_prefixes`` is then False). sglang's own /health probes are left
out. Traces are untrusted: counts and
lengths are bounded, and an arrival whose ids do not match its length is
refused with the file and offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final, Protocol

import msgspec

from schedtrace.tracer.contract.errors import TraceError, TraceFormatError
from schedtrace.tracer.contract.names import FINISH_REJECTED, SGLANG_HEALTH_CHECK_RID_PREFIX
from schedtrace.tracer.contract.prefix_ids import PREFIX_BLOCK_TOKENS, PREFIX_ID_BYTES, id_count, split_ids
from schedtrace.tracer.contract.schema import Abort, Arrival, Clock, Finish, Header, Record

MAX_REQUESTS: Final = 200_000  # arrivals one workload holds
MAX_INPUT_LEN: Final = 1 << 21  # tokens in one request's input (2M: beyond any context window)
ABORT_ALL: Final = "*"  # Abort.rid of an abort-all (an operator's, not a client's)
# Finish.reason values kept as they are; anything else is written as "other".
FINISH_REASONS: Final = frozenset({"length", "stop", "abort", FINISH_REJECTED})
NORMAL_FINISH: Final = frozenset({"length", "stop"})
REFUSED_FINISH: Final = frozenset({"abort", FINISH_REJECTED})  # the server ended it: a re-drive may see it again


class WorkloadRequest(msgspec.Struct, frozen=True):
    """One recorded request, as much of it as the trace holds (lengths, never tokens)."""

    t_ms: float  # arrival, ms after the workload's first arrival
    input_len: int
    output_len: int  # tokens it produced (its Finish); without a Finish, its max_new_tokens
    hash_ids: list[int]  # one per block of ``Workload.block`` input tokens
    max_new_tokens: int  # as the client asked
    ignore_eos: bool
    priority: int | None
    finish_reason: str | None  # "length", "stop", "abort", "rejected", "other"; None: no Finish recorded
    client_abort_ms: float | None = None  # the client dropped it this long after its arrival

    @property
    def client_aborted(self) -> bool:
        return self.client_abort_ms is not None

    @property
    def redrive_max_new_tokens(self) -> int:
        """What a re-drive asks for: the tokens it produced; an abort or an unfinished request
        keeps its own ask, so it is still running when its abort (or the trace's end) comes."""
        if self.client_aborted or self.finish_reason not in NORMAL_FINISH:
            return self.max_new_tokens
        return self.output_len


class Workload(msgspec.Struct, frozen=True):
    block: int  # input tokens per hash id
    shared_prefixes: bool  # the hash ids come from the trace's prefix ids
    requests: list[WorkloadRequest]


class _Seen(msgspec.Struct):
    wall_ns: int
    arrival: Arrival
    offset: int
    source: str


class WorkloadBuilder:
    """Feed it ``(source, offset, record, wall_ns)`` rank by rank; ``build()`` the workload."""

    def __init__(self, prefix_block: int) -> None:
        self.prefix_block = prefix_block
        self.arrivals: dict[str, _Seen] = {}
        self.finishes: dict[str, Finish] = {}
        self.aborts: dict[str, int] = {}  # rid -> earliest abort wall_ns
        self.fresh = 0  # hash ids given to blocks without a prefix id

    def feed(self, source: str, offset: int, record: Record, wall_ns: int) -> None:
        if isinstance(record, Arrival):
            if record.rid.startswith(SGLANG_HEALTH_CHECK_RID_PREFIX):
                return
            seen = self.arrivals.get(record.rid)
            if seen is not None and seen.wall_ns <= wall_ns:
                return
            if seen is None and len(self.arrivals) >= MAX_REQUESTS:
                raise TraceError(source, f"more than {MAX_REQUESTS} arrivals; a workload holds at most that many")
            if not 0 <= record.input_len <= MAX_INPUT_LEN or record.max_new_tokens < 0:
                raise TraceFormatError(source, offset, f"arrival {record.rid!r}: input_len {record.input_len} and "
                                       f"max_new_tokens {record.max_new_tokens}, expected 0..{MAX_INPUT_LEN} and >= 0")
            self.arrivals[record.rid] = _Seen(wall_ns, record, offset, source)
        elif isinstance(record, Finish):
            if record.rid in self.arrivals or len(self.finishes) < MAX_REQUESTS:
                self.finishes.setdefault(record.rid, record)
        elif isinstance(record, Abort) and record.rid != ABORT_ALL:
            if record.rid in self.aborts or len(self.aborts) < MAX_REQUESTS:
                self.aborts[record.rid] = min(wall_ns, self.aborts.get(record.rid, wall_ns))

    def build(self) -> Workload:
        shared = self.prefix_block > 0
        block = self.prefix_block if shared else PREFIX_BLOCK_TOKENS
        numbers: dict[bytes, int] = {}
        self.fresh = 0
        seen = sorted(self.arrivals.values(), key=lambda s: s.wall_ns)
        origin = seen[0].wall_ns if seen else 0
        requests = []
        for s in seen:
            a = s.arrival
            finish = self.finishes.get(a.rid)
            abort_ns = self.aborts.get(a.rid)
            requests.append(WorkloadRequest(
                t_ms=(s.wall_ns - origin) / 1e6,
                input_len=a.input_len,
                output_len=max(finish.output_len, 0) if finish is not None else a.max_new_tokens,
                hash_ids=self._numbered(s, block, numbers, shared),
                max_new_tokens=a.max_new_tokens,
                ignore_eos=a.ignore_eos,
                priority=a.priority,
                finish_reason=None if finish is None else
                (finish.reason if finish.reason in FINISH_REASONS else "other"),
                client_abort_ms=None if abort_ns is None else max(abort_ns - s.wall_ns, 0) / 1e6,
            ))
        return Workload(block=block, shared_prefixes=shared, requests=requests)


    def _numbered(self, seen: _Seen, block: int, numbers: dict[bytes, int], shared: bool) -> list[int]:
        """The arrival's prefix ids as small ints, numbered in first-seen order; a request without
        ids gets fresh numbers, shared with no one."""
        a = seen.arrival
        expected = id_count(a.input_len, block)
        if not shared or not a.prefix_ids:
            first = len(numbers) + self.fresh
            self.fresh += expected
            return list(range(first, first + expected))
        ids = split_ids(a.prefix_ids)
        if len(ids) != expected or len(a.prefix_ids) % PREFIX_ID_BYTES:
            raise TraceFormatError(seen.source, seen.offset, f"arrival {a.rid!r}: {len(a.prefix_ids)} bytes of "
                                   f"prefix ids for input_len {a.input_len}, expected {expected} ids of "
                                   f"{PREFIX_ID_BYTES} bytes (block {block})")
        return [numbers.setdefault(i, len(numbers) + self.fresh) for i in ids]


class Reader(Protocol):
    """A trace file or one rank's parts (``TraceReader``, ``RankTrace``)."""

    path: str
    header: Header

    def records(self, start: int = 0) -> Iterator[tuple[int, Record]]: ...


def read_workload(ranks: Iterable[Reader]) -> Workload:
    """The workload of these ranks' records, on the wall clock (each record placed by its rank's
    latest ``Clock``, as the exporters do), arrivals of every rank merged."""
    ranks = list(ranks)
    blocks = {r.header.prefix_block for r in ranks}
    if len(blocks) > 1:
        raise TraceError(ranks[0].path, f"ranks record prefix ids in blocks of {sorted(blocks)} tokens; expected one")
    builder = WorkloadBuilder(blocks.pop() if blocks else 0)
    for rank in ranks:
        offset = rank.header.start_wall_ns  # wall_ns - t_ns
        for at, record in rank.records():
            if isinstance(record, Clock):
                offset = record.wall_ns - record.t_ns
            elif isinstance(record, (Arrival, Finish, Abort)):
                builder.feed(str(rank.path), at, record, offset + record.t_ns)
    return builder.build()
