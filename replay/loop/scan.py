"""One scan of a trace: what every closed loop reads from it, whatever its start.

``scan_trace`` reads the trace once for the pass clock, the arrivals and the
requeues, each request's recorded output length and prefix matches, and the
recording's own outcome the self-check compares the stock arm with
(``schedtrace.replay.loop.selfcheck``); ``schedtrace.replay.loop.input``
turns a scan and a start into a ``LoopInput``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from schedtrace.replay.loop.clock import IdleMarks, PassClock
from schedtrace.replay.loop.draws import RANDOM, Draw
from schedtrace.replay.loop.preemption import requeued_at
from schedtrace.replay.routing_keys import ROUTING_KEY, KeyTextOrder
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import FINISH_REJECTED
from schedtrace.tracer.contract.schema import Arrival, Finish, Idle, Pass, Retract


# Finish reasons of a request that may leave the queue without running (an abort, a rejection).
LEFT_THE_QUEUE = frozenset({"abort", FINISH_REJECTED})


@dataclass
class TraceScan:
    """What one scan of the trace gives every closed loop, whatever its start."""

    points: list[tuple[int, int]]  # (scheduler pass number, t_ns) of each pass record read
    arrivals: list[Arrival]
    targets: dict[str, int]  # rid -> recorded output length
    clock: PassClock
    # rid -> each change of its recorded match: (trace pass number, prefix match, what locking
    # it took from the evictable count, None where no candidate row says)
    matches: dict[str, list[tuple[int, int, int | None]]] = field(default_factory=dict)
    requeues: list[Retract] = field(default_factory=list)  # retractions, and preemption releases as such
    # The recording's own outcome (the self-check's reference):
    admitted_at: dict[str, int] = field(default_factory=dict)  # rid -> trace pass number first admitting it
    # rid -> (that pass, whether it began a chunked prefill, its place among the pass's admissions):
    # the order its first prefill entered the server's tree (``tree_order.first_inserts``)
    first_prefills: dict[str, tuple[int, bool, int]] = field(default_factory=dict)
    finished_ns: dict[str, int] = field(default_factory=dict)  # rid -> t_ns of its finish
    ended_early: dict[str, int] = field(default_factory=dict)  # rid -> t_ns it was aborted or rejected
    queue_lengths: list[int] = field(default_factory=list)  # waiting requests at each point's pass entry
    # The pass index of each point (``pass_at``'s): 0, 1, 2, ... but past an unreadable
    # region (a reader with ``skip_damaged``), whose pass records are missing here.
    numbers: list[int] = field(default_factory=list)
    # Each point's Pass.processed_tokens (sglang's counter hrrn ages the queue by; None: not recorded)
    processed: list[int | None] = field(default_factory=list)
    draws: list[Draw] = field(default_factory=list)  # under the random policy, each point's draw
    # The server ran sglang's overlap scheduler: a running request was seen without its first output
    # (its prefill's result not yet processed), which the normal loop never shows. Only for traces
    # whose header does not say (``Header.overlap_schedule`` None).
    overlap: bool = False
    key_text: KeyTextOrder | None = None  # under the routing-key policy, the keys' text order its passes show
    # rid -> the scheduler pass after the last pass record that showed it waiting, for requests
    # aborted while waiting: the pass that took the abort (an idle one, when nothing else waited).
    waited_until: dict[str, int] = field(default_factory=dict)
    # Requests that ran, went back to the queue (a retraction, a preemption) and left it aborted
    # (a queue limit's priority abort, a client's): their recorded output is where they were
    # requeued, not where a loop should finish them.
    requeued_then_left: set[str] = field(default_factory=set)
    aborted_running: set[str] = field(default_factory=set)  # requests a client aborted while they ran

    def position(self, pass_no: int) -> int:
        """The point of trace pass ``pass_no``, or of the first read after it; ``len(points)`` if none."""
        return bisect_left(self.numbers, pass_no)

    def iteration_of(self, pass_no: int) -> int:
        """The scheduler pass number of trace pass ``pass_no`` (past the last point: the last)."""
        return self.points[min(self.position(pass_no), len(self.points) - 1)][0] if self.points else 0


def scan_trace(reader: TraceReader) -> TraceScan:
    """The pass clock, arrivals, output lengths and the recorded outcome, from one scan.

    The clock counts every scheduler pass: pass records with their folded
    repeats, and the idle passes between them. The recorder counts idle
    passes in ``idle`` records (and the ones right before a pass again in its
    ``idle_before``), each a clock point too (a decode tail past the last
    pass record runs at its own pace, not the trace's mean); without ``idle``
    records, by ``idle_before`` alone. Pass records lost in an unreadable
    region count one scheduler pass each: their folds and the idle passes
    around them are lost with them.
    """
    by_idle_records, by_idle_before, idle_marks = [], [], IdleMarks()  # (scheduler pass, t_ns) points
    arrivals: list[Arrival] = []
    requeues: list[Retract] = []
    targets: dict[str, int] = {}
    matches: dict[str, tuple[int, int, int | None]] = {}
    admitted_at: dict[str, int] = {}  # rid -> the pass that first admitted it; finished_ns, ended_early: its finish
    first_prefills: dict[str, tuple[int, bool, int]] = {}
    finished_ns: dict[str, int] = {}
    ended_early: dict[str, int] = {}
    processed: list[int | None] = []
    draws: list[Draw] = []
    policy = reader.header.server_args.schedule_policy
    random_policy = policy == RANDOM
    key_text = KeyTextOrder() if policy == ROUTING_KEY else None
    queue_lengths: list[int] = []
    numbers: list[int] = []
    waited: dict[str, tuple[int, int]] = {}  # rid -> (point, repeat) of the last record showing it waiting
    ran: dict[str, int] = {}  # rid -> the point of the last record showing it running, chunked or admitted
    first, overlap, seen_idle_record = reader.header.first_pass, False, False
    it_records = it_before = 0
    for _, record in reader.records():
        idle_marks.see(record)
        if isinstance(record, Pass):
            index = record.seq - first  # the reader's pass index (a later part's seqs start past 0)
            lost = index - (numbers[-1] + 1 if numbers else 0)
            if lost > 0:  # past an unreadable region
                it_records += lost
                it_before += lost
            numbers.append(index)
            it_before += max(record.idle_before, 0)
            by_idle_records.append((it_records, record.t_ns))
            by_idle_before.append((it_before, record.t_ns))
            it_records += max(record.repeat, 1)
            it_before += max(record.repeat, 1)
            point = len(numbers) - 1
            for w in record.waiting:
                waited[w.rid] = (point, max(record.repeat, 1))
            for row in (*record.running, *record.admitted, *((record.chunked,) if record.chunked else ())):
                ran[row.rid] = point
            queue_lengths.append(len(record.waiting))
            processed.append(record.processed_tokens)
            if random_policy:
                draws.append((tuple(w.rid for w in record.waiting), record.order))
            if key_text is not None and record.order is not None:
                key_text.observe(record)
            overlap = overlap or any(r.output_len == 0 for r in record.running)
            _note_matches(matches, index, record)
            for place, admitted in enumerate(record.admitted):
                if admitted.rid not in admitted_at:
                    admitted_at[admitted.rid] = index
                    first_prefills[admitted.rid] = (index, admitted.rid == record.new_chunked_rid, place)
            for order, released in enumerate(record.released or ()):  # back in the queue at the pass's end
                at = requeued_at(record.t_ns + record.dur_ns, order)
                requeues.append(Retract(t_ns=at, rid=released.rid, output_len=0))
        elif isinstance(record, Retract):
            requeues.append(record)
        elif isinstance(record, Idle):
            seen_idle_record = True
            it_records += max(record.count, 0)
            idle_marks.idle(it_records, record.t_ns)
        elif isinstance(record, Arrival):
            arrivals.append(record)
            if key_text is not None:
                key_text.note(record)
        elif isinstance(record, Finish):
            targets[record.rid] = record.output_len
            finished_ns.setdefault(record.rid, record.t_ns)
            if record.reason in LEFT_THE_QUEUE:
                ended_early.setdefault(record.rid, record.t_ns)
    points = by_idle_records if seen_idle_record else by_idle_before
    # Ended early: after the last record showing it run (never, for one that never ran), a later one
    # showed it waiting, or none did.
    left_waiting = {rid for rid in ended_early if rid in waited and waited[rid][0] > ran.get(rid, -1)}
    ran_first = {rid for rid in ended_early if rid in ran}
    return TraceScan(
        points=points, arrivals=arrivals, requeues=requeues, targets=targets, clock=PassClock(points, idle_marks.points if seen_idle_record else ()), matches=matches,
        admitted_at=admitted_at, first_prefills=first_prefills, finished_ns=finished_ns, ended_early=ended_early, processed=processed, draws=draws, queue_lengths=queue_lengths, numbers=numbers,
        overlap=overlap, key_text=key_text,
        waited_until={rid: points[waited[rid][0]][0] + waited[rid][1] for rid in left_waiting},
        requeued_then_left=left_waiting & ran_first,
        aborted_running=ran_first - left_waiting,
    )


def _note_matches(matches: dict[str, list[tuple[int, int, int | None]]], index: int, p) -> None:
    """The matches pass ``index`` shows that differ from each request's last one: its
    candidate row's where it has one (with the evictable part locking took), else its waiting row's.
    A requeued request's candidate row counts even at 0 (the tree lost what it had inserted) and
    even unchanged: a loop starting after its requeue reads its matches from then on only."""
    requeued = {w.rid for w in p.waiting if w.output_len > 0}
    seen = {c.rid: (c.prefix_len, c.locked_evictable) for c in p.candidates if c.prefix_len > 0 or c.rid in requeued}
    for w in p.waiting:
        if w.prefix_len > 0 and w.output_len == 0:
            seen.setdefault(w.rid, (w.prefix_len, None))
    for rid, (prefix, locked) in seen.items():
        changes = matches.setdefault(rid, [])
        if (not changes or changes[-1][1] != prefix or (locked is not None and changes[-1][2] != locked)
                or rid in requeued):
            changes.append((index, prefix, locked))
