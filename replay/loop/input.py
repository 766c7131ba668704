"""What a closed loop reads from the trace: its start state, the arrivals, the pass clock.

One scan of the trace (``scan_trace``) gives every closed loop what it
needs whatever its start, and the recording's own outcome the self-check
compares the stock arm with (``schedtrace.replay.loop.selfcheck``);
``load_input`` turns the scan and the recorded pass at ``from_pass`` into a
``LoopInput``. Inputs the loop takes from the recording, as the driver takes
the cache's inputs from a pass: each request's output length (its
``finish``) and its prefix match as the recording saw it change: from
each pass whose waiting row or candidate row shows a new match (a
cache-aware policy matches every waiting request every pass, and a match
grows as a shared prefix's chunks land).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from schedtrace.replay.loop.arm_tree import MatchHistory
from schedtrace.replay.loop.draws import RANDOM, Draw, RecordedDraws
from schedtrace.replay.loop.in_flight import mark_in_flight
from schedtrace.replay.loop.micro_batches import MicroBatch
from schedtrace.replay.loop.pools import FULL_POOL, LoopPools, swa_window_tokens
from schedtrace.replay.loop.ratio import RatioRule
from schedtrace.replay.loop.retraction import RetractionOrder
from schedtrace.replay.loop.chunk_sizer import ChunkSizes
from schedtrace.replay.loop.state import LoopReq, LoopState
from schedtrace.replay.loop.tree_order import BlockAges
from schedtrace.replay.loop.tree_share import settle_start
from schedtrace.replay.routing_keys import ROUTING_KEY, KeyTextOrder
from schedtrace.replay.loop.clock import PassClock
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.errors import ReplayStateError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import FINISH_REJECTED, SGLANG_TEST_RETRACT, SGLANG_TEST_RETRACT_INTERVAL
from schedtrace.tracer.contract.schema import (
    Arrival, ChunkedReq, Finish, Header, Idle, Pass, Retract, RunningReq, WaitingReq,
)


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
    ``idle_before``); a trace without ``idle`` records is counted by
    ``idle_before`` alone. Pass records lost in an unreadable region count
    one scheduler pass each: their folds and the idle passes around them are
    lost with them.
    """
    by_idle_records: list[tuple[int, int]] = []
    by_idle_before: list[tuple[int, int]] = []
    arrivals: list[Arrival] = []
    requeues: list[Retract] = []
    targets: dict[str, int] = {}
    matches: dict[str, tuple[int, int, int | None]] = {}
    admitted_at: dict[str, int] = {}
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
    first = reader.header.first_pass
    overlap = False
    it_records = it_before = 0
    seen_idle_record = False
    for _, record in reader.records():
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
            for admitted in record.admitted:
                admitted_at.setdefault(admitted.rid, index)
            for released in record.released or ():  # back in the queue at the pass's end
                requeues.append(Retract(t_ns=record.t_ns + record.dur_ns, rid=released.rid, output_len=0))
        elif isinstance(record, Retract):
            requeues.append(record)
        elif isinstance(record, Idle):
            seen_idle_record = True
            it_records += max(record.count, 0)
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
        points=points, arrivals=arrivals, requeues=requeues, targets=targets, clock=PassClock(points), matches=matches,
        admitted_at=admitted_at, finished_ns=finished_ns, ended_early=ended_early, processed=processed, draws=draws, queue_lengths=queue_lengths, numbers=numbers,
        overlap=overlap, key_text=key_text,
        waited_until={rid: points[waited[rid][0]][0] + waited[rid][1] for rid in left_waiting},
        requeued_then_left=left_waiting & ran_first,
        aborted_running=ran_first - left_waiting,
    )


@dataclass
class LoopInput:
    """Everything a closed loop needs from the trace, read once."""

    header: Header
    from_pass: int
    start: Pass  # the recorded pass at from_pass
    initial: LoopState
    arrivals: list[tuple[int, LoopReq]]  # (step, request), in arrival order
    clock: PassClock
    start_iteration: int
    recorded_passes: int
    # (scheduler pass, sglang's processed-tokens counter at its entry) of each pass record
    processed_points: list[tuple[int, int]] = field(default_factory=list)
    draws: RecordedDraws = field(default_factory=RecordedDraws)  # under the random policy
    # (step, rid): a request the recording aborted or rejected: it leaves a loop's queue then, and a
    # loop's chunked prefill (sglang's process_pending_chunked_abort); a running one ends at its finish
    leaves: list[tuple[int, str]] = field(default_factory=list)
    # (step, rid, prefix match, its part in the evictable count), by step
    matches: list[tuple[int, str, int, int | None]] = field(default_factory=list)
    overlap: bool = False  # the recorded server's overlap scheduler (its header's, else TraceScan.overlap)
    # Every arrival record: what the driver's ArrivalBook keeps of each (prefix ids, hrrn's stamp).
    arrival_records: list[Arrival] = field(default_factory=list)
    # The requests that ran and finished before the start, in arrival order: their prompts were cached.
    ran_before: list[Arrival] = field(default_factory=list)
    requeued_before: list[Retract] = field(default_factory=list)  # the requeues before the start, by time
    # How a loop's queue breaks ties the recording cannot order for it: dfs-weight's branch ages, or
    # routing-key's key text. Arms share it.
    tie_order: BlockAges | KeyTextOrder | None = field(default=None, compare=False, repr=False)

    def processed_at(self, iteration: int) -> int:
        """sglang's processed-tokens counter at scheduler pass ``iteration``: the recording's, as the
        pass clock's times are (its quirks included: it is what the recorded arrival stamps count by).
        Between pass records only decodes run, so it is the next record's (past the last: the last)."""
        counts = self.processed_points
        if not counts:
            return 0
        return counts[min(bisect_left(counts, (iteration, -1)), len(counts) - 1)][1]

    @property
    def page_size(self) -> int:
        return max(1, self.header.server_args.page_size)

    @property
    def radix_cache(self) -> bool:
        return not self.header.server_args.disable_radix_cache

    @property
    def mixed_chunk(self) -> bool:
        return self.header.server_args.enable_mixed_chunk

    @property
    def pools(self) -> LoopPools:
        return LoopPools.of(self.header)

    @property
    def ratio_rule(self) -> RatioRule:
        return RatioRule.of(self.header)

    @property
    def retraction(self) -> RetractionOrder:
        return RetractionOrder.of(self.header)

    @property
    def chunk_sizes(self) -> ChunkSizes:
        return ChunkSizes(self.header, self.start.chunked_prefill_size)

    @property
    def retract_every(self) -> int:
        """Forwards between the retractions of sglang's ``SGLANG_TEST_RETRACT`` hook; 0: it was off."""
        settings = self.header.settings
        return int(settings.get(SGLANG_TEST_RETRACT_INTERVAL, 0) or 0) if settings.get(SGLANG_TEST_RETRACT) else 0


def load_input(reader: TraceReader, from_pass: int = 0, scan: TraceScan | None = None) -> LoopInput:
    """The closed loop's start: the recorded state at ``from_pass`` and what comes after."""
    count = reader.pass_count
    if count == 0:
        raise ReplayStateError(f"{reader.path}: the trace has no pass records to start a closed loop from")
    if not 0 <= from_pass < count:
        raise UsageError(f"--from {from_pass}: the trace has passes 0..{count - 1}")
    scan = scan if scan is not None else scan_trace(reader)
    at = scan.position(from_pass)
    if at < len(scan.numbers) and scan.numbers[at] != from_pass:  # lost (past the last point: a torn tail)
        nearest = (f"the nearest passes read are {scan.numbers[at - 1]} and {scan.numbers[at]}" if at
                   else f"the first pass read is {scan.numbers[at]}")
        raise UsageError(f"--from {from_pass}: {reader.path}: pass {from_pass} was lost in an unreadable region; "
                         f"{nearest}")
    start = replay_inputs(reader.pass_at(from_pass))
    # The index and the scan disagree only on a torn file: then the last point.
    start_iteration = scan.iteration_of(from_pass)
    header = reader.header
    pools = LoopPools.of(header)
    targets = {rid: n for rid, n in scan.targets.items() if rid not in scan.requeued_then_left}
    initial = initial_state(start, targets, pools, page_size=max(1, header.server_args.page_size))
    initial.parked = _parked(reader, scan, from_pass, start_iteration, initial, targets, pools)
    overlap = scan.overlap if header.overlap_schedule is None else header.overlap_schedule  # recorded, else inferred
    if overlap and from_pass > 0:
        at, previous = scan.position(from_pass), None
        if at > 0 and scan.numbers[at - 1] == from_pass - 1:  # the record before, if it is the pass before
            previous = reader.pass_at(from_pass - 1)
            if scan.iteration_of(from_pass - 1) + max(previous.repeat, 1) != start_iteration:
                previous = None  # the scheduler idled in between
        mark_in_flight(initial, previous, mixed_chunk=header.server_args.enable_mixed_chunk)
    known = {r.rid for r in initial.requests()}
    arrived = {a.rid: a for a in scan.arrivals if a.rid in known}
    for req in initial.requests():
        arrival = arrived.get(req.rid)
        req.prefix_ids = arrival.prefix_ids if arrival is not None else b""
        if req.priority is None and arrival is not None:  # a running row has none: its arrival's
            req.priority = arrival.priority
        req.ends_by_abort = req.rid in scan.aborted_running
    ran_before = [a for a in scan.arrivals if a.rid not in known and a.t_ns <= start.t_ns and scan.targets.get(a.rid, 0)]
    future: list[tuple[int, LoopReq]] = []
    for event in scan.arrivals:
        if event.rid in known or event.t_ns <= start.t_ns:
            continue  # already in the start state, or done with before it
        known.add(event.rid)
        step = max(1, scan.clock.record_after(event.t_ns) - start_iteration)
        future.append((step, _loop_req(event, targets, priority=event.priority, prefix_ids=event.prefix_ids,
                                       ends_by_abort=event.rid in scan.aborted_running)))
    future.sort(key=lambda item: item[0])  # stable: arrival order within a step
    matches = sorted(
        (scan.iteration_of(pass_no) - start_iteration, rid, prefix, locked)
        for rid, changes in scan.matches.items() if rid in known
        for pass_no, prefix, locked in changes
    )
    if from_pass > 0 and not header.server_args.disable_radix_cache and not header.is_hybrid_swa:
        settle_start(initial, max(1, header.server_args.page_size), header.prefix_block, MatchHistory(matches))
    return LoopInput(
        header=header,
        from_pass=from_pass,
        start=start,
        initial=initial,
        arrivals=future,
        clock=scan.clock,
        start_iteration=start_iteration,
        recorded_passes=count,
        matches=matches,
        overlap=overlap,
        arrival_records=scan.arrivals,
        ran_before=ran_before,
        requeued_before=[r for r in scan.requeues if r.t_ns <= start.t_ns],
        tie_order=BlockAges.for_loop(header, scan.arrivals) or scan.key_text,
        draws=RecordedDraws({it: draw for (it, _), draw in zip(scan.points, scan.draws)}),
        processed_points=[(it, value or 0) for (it, _), value in zip(scan.points, scan.processed)],
        leaves=sorted((max(_left_at(scan, rid, t_ns) - start_iteration, 0), rid)
                      for rid, t_ns in scan.ended_early.items() if rid in known),
    )


def _left_at(scan: TraceScan, rid: str, t_ns: int) -> int:
    """The scheduler pass that took ``rid``'s abort or rejection: right after the last record that
    showed it waiting (the pass that took it may be idle, so unrecorded), else the first record
    after it (a request that ran, or never waited in a recorded pass)."""
    waited = scan.waited_until.get(rid)
    return waited if waited is not None else scan.clock.record_after(t_ns)


def _target(rid: str, max_new_tokens: int, targets: dict[str, int]) -> int:
    """Output length at which the request finishes: recorded, else its limit."""
    return max(1, targets.get(rid, max_new_tokens))


def _loop_req(
    row: Arrival | WaitingReq | RunningReq | ChunkedReq, targets: dict[str, int], **state: int | bool | bytes | None
) -> LoopReq:
    """A recorded request (arrival or queue row) as loop state; ``state`` is what differs."""
    return LoopReq(
        rid=row.rid,
        input_len=row.input_len,
        max_new_tokens=row.max_new_tokens,
        target_output=_target(row.rid, row.max_new_tokens, targets),
        ignore_eos=row.ignore_eos,
        **state,
    )


def initial_state(
    p: Pass, targets: dict[str, int], pools: LoopPools = FULL_POOL, *, page_size: int = 1
) -> LoopState:
    """The loop state at a recorded pass's entry.

    What each request holds of the hybrid pools is not recorded: a running
    request is taken to hold its window on the SWA side (its older tokens
    already slid out) and a chunked one all it prefilled (a prefill slides
    only without a radix cache); each holds ``mamba_slots_per_req`` slots, and
    where checkpoints fork the state (``LoopPools.mamba_forks``), its last fork.
    """
    kv = p.kv
    swa = pools.paged_swa and kv.swa_available is not None
    mamba = pools.mamba_slots_per_req > 0 and kv.mamba_available is not None

    def held(tokens: int, window_only: bool) -> dict[str, int | bool]:
        out = {"kv_tokens": tokens, "kv_held": tokens}
        if swa:
            out["swa_held"] = swa_window_tokens(tokens, pools.swa_window, page_size) if window_only else tokens
        if mamba:
            out["mamba_held"] = pools.mamba_slots_per_req
            out["mamba_fork"] = pools.mamba_forks
        return out

    waiting = [
        _loop_req(w, targets, output_len=w.output_len, prefix_len=w.prefix_len, priority=w.priority)
        for w in p.waiting
    ]
    running = []
    for r in p.running:
        # KV holds the prompt and every output but the newest (decoded next pass).
        tokens = r.input_len + max(r.output_len - 1, 0)
        running.append(_loop_req(r, targets, output_len=r.output_len, **held(tokens, True)))
    c = p.chunked
    chunked = (
        None
        if c is None
        else _loop_req(c, targets, output_len=c.output_len, prefix_len=c.prefix_len, **held(c.prefix_len, False))
    )
    return LoopState(
        waiting=waiting,
        running=running,
        chunked=chunked,
        batch_is_full=p.batch_is_full_in,
        free=kv.available,
        evictable=kv.evictable,
        req_slots_free=p.req_slots_free,
        swa_free=kv.swa_available if swa else None,
        swa_evictable=(kv.swa_evictable or 0) if swa else None,
        mamba_free=kv.mamba_available if mamba else None,
        mamba_evictable=(kv.mamba_evictable or 0) if mamba else None,
        forward_ct=p.forward_ct,
        new_token_ratio=p.new_token_ratio,
    )


def _parked(reader: TraceReader, scan: TraceScan, from_pass: int, start_iteration: int, initial: LoopState,
            targets: dict[str, int], pools: LoopPools) -> list[MicroBatch]:
    """The pipeline's other micro-batches at the start: the running requests the passes after it
    record, each where that pass follows at once (an unrecorded turn starts empty)."""
    parked: list[MicroBatch] = []
    known = {r.rid for r in initial.requests()}
    page_size = max(1, reader.header.server_args.page_size)
    for turn in range(1, capacity.micro_batches(reader.header)):
        at = from_pass + turn
        batch = MicroBatch()
        if at < reader.pass_count and scan.iteration_of(at) == start_iteration + turn:
            running = initial_state(replay_inputs(reader.pass_at(at)), targets, pools, page_size=page_size).running
            batch.running = [r for r in running if r.rid not in known]
            known.update(r.rid for r in batch.running)
        parked.append(batch)
    return parked


def _note_matches(matches: dict[str, list[tuple[int, int, int | None]]], index: int, p) -> None:
    """The matches pass ``index`` shows that differ from each request's last one: its
    candidate row's where it has one (with the evictable part locking took), else its waiting row's.
    A requeued request's candidate row counts even at 0: the tree lost what it had inserted."""
    requeued = {w.rid for w in p.waiting if w.output_len > 0}
    seen = {c.rid: (c.prefix_len, c.locked_evictable) for c in p.candidates if c.prefix_len > 0 or c.rid in requeued}
    for w in p.waiting:
        if w.prefix_len > 0 and w.output_len == 0:
            seen.setdefault(w.rid, (w.prefix_len, None))
    for rid, (prefix, locked) in seen.items():
        changes = matches.setdefault(rid, [])
        if not changes or changes[-1][1] != prefix or (locked is not None and changes[-1][2] != locked):
            changes.append((index, prefix, locked))
