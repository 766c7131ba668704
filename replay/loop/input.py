"""What a closed loop starts from: its start state, the arrivals after it, the pass clock.

``load_input`` turns a scan of the trace (``schedtrace.replay.loop.scan``)
and the recorded pass at ``from_pass`` into a ``LoopInput``. Inputs the
loop takes from the recording, as the driver takes the cache's inputs from
a pass: each request's output length (its ``finish``) and its prefix match
as the recording saw it change: from each pass whose waiting row or
candidate row shows a new match (a cache-aware policy matches every waiting
request every pass, and a match grows as a shared prefix's chunks land).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import msgspec

from schedtrace.replay.loop.arm_tree import MatchHistory
from schedtrace.replay.loop.draws import RecordedDraws
from schedtrace.replay.loop.in_flight import mark_in_flight
from schedtrace.replay.loop.micro_batches import MicroBatch
from schedtrace.replay.loop.pools import FULL_POOL, LoopPools, floor_page, swa_window_tokens
from schedtrace.replay.loop.ratio import RatioRule
from schedtrace.replay.loop.retraction import RetractionOrder
from schedtrace.replay.loop.chunk_sizer import ChunkSizes
from schedtrace.replay.loop.state import LoopReq, LoopState
from schedtrace.replay.loop.tree_order import BlockAges, first_inserts
from schedtrace.replay.loop.tree_share import settle_start
from schedtrace.replay.routing_keys import KeyTextOrder
from schedtrace.replay.loop.clock import PassClock
from schedtrace.replay.loop.scan import TraceScan, scan_trace
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.errors import ReplayStateError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import SGLANG_TEST_RETRACT, SGLANG_TEST_RETRACT_INTERVAL
from schedtrace.tracer.contract.schema import (
    Arrival, ChunkedReq, Header, Pass, Retract, RunningReq, WaitingReq,
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
    initial.parked = _parked(reader, scan, from_pass, start_iteration, start.t_ns, initial, targets, pools)
    overlap = scan.overlap if header.overlap_schedule is None else header.overlap_schedule  # recorded, else inferred
    previous = None
    if overlap and from_pass > 0:
        at = scan.position(from_pass)
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
    requeued_before = [r for r in scan.requeues if r.t_ns <= start.t_ns]
    # A request requeued before the start: its matches before its last requeue were of its old life.
    requeued_at = {r.rid: scan.clock.record_after(r.t_ns) for r in requeued_before}
    matches = sorted(
        (iteration - start_iteration, rid, prefix, locked)
        for rid, changes in scan.matches.items() if rid in known
        for pass_no, prefix, locked in changes
        if (iteration := scan.iteration_of(pass_no)) >= requeued_at.get(rid, iteration)
    )
    if from_pass > 0 and not header.server_args.disable_radix_cache and not header.is_hybrid_swa:
        requeues: dict[str, list[int]] = {}  # rid -> its outputs at each requeue, by time
        for r in requeued_before:
            requeues.setdefault(r.rid, []).append(r.output_len)
        # Where two prompts part inside a block, any of their family's recorded matches says where.
        kin_matches = [(scan.iteration_of(pass_no) - start_iteration, rid, prefix, locked)
                       for rid, changes in scan.matches.items() if rid not in known
                       for pass_no, prefix, locked in changes]
        settle_start(initial, max(1, header.server_args.page_size), header.prefix_block,
                     MatchHistory([*matches, *kin_matches]), requeues,
                     keeps_own=not header.is_hybrid_mamba or pools.mamba_forks,
                     prompts={a.rid: a.prefix_ids for a in scan.arrivals},
                     in_tree_before={a.rid: a.prefix_len for a in previous.admitted} if previous else None)
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
        requeued_before=requeued_before,
        tie_order=BlockAges.for_loop(header, scan.arrivals, first_inserts(scan.first_prefills, overlap))
        or scan.key_text,
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


def _parked(reader: TraceReader, scan: TraceScan, from_pass: int, start_iteration: int, start_ns: int,
            initial: LoopState, targets: dict[str, int], pools: LoopPools) -> list[MicroBatch]:
    """The pipeline's other micro-batches at the start: the running requests and the latch the
    passes after it record, each where that pass follows at once (an unrecorded turn starts empty).

    A turn's results are processed in the loop, at the step before it: a request its last turn
    decoded to its end is in no pass's running batch but still holds its KV and slot. It is taken
    from that last turn, one token on, to finish there."""
    parked: list[MicroBatch] = []
    known = {r.rid for r in initial.requests()}
    page_size = max(1, reader.header.server_args.page_size)
    loop_size = capacity.micro_batches(reader.header)

    def recorded(at: int, iteration: int) -> Pass | None:
        ok = 0 <= at < reader.pass_count and scan.iteration_of(at) == iteration
        return replay_inputs(reader.pass_at(at)) if ok else None

    for turn in range(1, loop_size):
        batch = MicroBatch()
        after = recorded(from_pass + turn, start_iteration + turn)
        before = recorded(from_pass + turn - loop_size, start_iteration + turn - loop_size)
        if after is not None:
            turn_state = initial_state(after, targets, pools, page_size=page_size)
            batch.running = [r for r in turn_state.running if r.rid not in known]
            batch.batch_is_full = turn_state.batch_is_full
            known.update(r.rid for r in batch.running)
            # What its last turn prefilled reaches the tree as that result is processed, in the loop.
            prefilled = {a.rid for a in before.admitted} if before is not None else set()
            for req in batch.running:
                if req.rid in prefilled:
                    req.tree_landing = floor_page(req.fill_len, page_size)
        if before is not None:
            end_ns = after.t_ns if after is not None else None
            ending = [msgspec.structs.replace(r, output_len=r.output_len + 1) for r in before.running
                      if r.rid not in known and start_ns < (done := scan.finished_ns.get(r.rid, -1))
                      and (end_ns is None or done <= end_ns)]
            if ending:
                last = msgspec.structs.replace(before, running=ending, waiting=[], chunked=None)
                batch.running += initial_state(last, targets, pools, page_size=page_size).running
                known.update(r.rid for r in ending)
        parked.append(batch)
    return parked
