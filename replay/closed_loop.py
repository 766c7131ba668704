"""Closed-loop (counterfactual) replay: what would have happened under each arm.

Open-loop replay asks every arm about the *recorded* states. Here each arm
starts from the recorded state at pass ``from_pass`` and lives with its own
decisions: ``schedtrace.replay.loop_state`` moves the state one scheduling step at a
time, ``schedtrace.replay.driver.PassDriver`` decides each step with the real sglang
code. Requests arrive at their recorded times (``arrive`` events, mapped to
steps with the recorded pass clock, idle and folded passes included) and
finish at their recorded output lengths (``finish`` events).

Closed-loop pass numbers continue from ``from_pass``: pass ``from_pass + k``
is the k-th scheduling step after it. Everything is deterministic: the same
trace and arms give the same result.

On a hybrid trace every pool evolves (``schedtrace.replay.loop_pools``: the
SWA side, the mamba state slots), and every step checks that no pool made or
lost a unit (``LoopState.pool_totals``): a failed check is a model bug and
raises ``ReplayStateError`` naming the pool and the pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Final

import msgspec

from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.replay.loop_pools import FULL_POOL, LoopPools, swa_window_tokens
from schedtrace.replay.pass_clock import PassClock
from schedtrace.replay.loop_state import LoopReq, LoopState, apply_decision, to_pass, with_outputs
from schedtrace.tracer.contract.report import ArmError, ArmOutcome, ClosedLoop, Decision, Stall
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.analysis.stalls import find_stalls
from schedtrace.tracer.contract.errors import ReplayStateError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Arrival, ChunkedReq, Finish, Header, Idle, Pass, RunningReq, WaitingReq

MAX_ERRORS_LISTED: Final = 20  # per arm; ``exceptions`` still counts them all


# ------------------------------------------------------------------- input


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

    @property
    def page_size(self) -> int:
        return max(1, self.header.server_args.page_size)

    @property
    def radix_cache(self) -> bool:
        return not self.header.server_args.disable_radix_cache

    @property
    def pools(self) -> LoopPools:
        return LoopPools.of(self.header)


@dataclass
class TraceScan:
    """What one scan of the trace gives every closed loop, whatever its start."""

    points: list[tuple[int, int]]  # (scheduler pass number, t_ns) of each pass record
    arrivals: list[Arrival]
    targets: dict[str, int]  # rid -> recorded output length
    clock: PassClock


def scan_trace(reader: TraceReader) -> TraceScan:
    """The pass clock, arrivals and output lengths, from one scan.

    The clock counts every scheduler pass: pass records with their folded
    repeats, and the idle passes between them. The recorder counts idle
    passes in ``idle`` records (and the ones right before a pass again in its
    ``idle_before``); a trace without ``idle`` records is counted by
    ``idle_before`` alone.
    """
    by_idle_records: list[tuple[int, int]] = []
    by_idle_before: list[tuple[int, int]] = []
    arrivals: list[Arrival] = []
    targets: dict[str, int] = {}
    it_records = it_before = 0
    seen_idle_record = False
    for _, record in reader.records():
        if isinstance(record, Pass):
            it_before += max(record.idle_before, 0)
            by_idle_records.append((it_records, record.t_ns))
            by_idle_before.append((it_before, record.t_ns))
            it_records += max(record.repeat, 1)
            it_before += max(record.repeat, 1)
        elif isinstance(record, Idle):
            seen_idle_record = True
            it_records += max(record.count, 0)
        elif isinstance(record, Arrival):
            arrivals.append(record)
        elif isinstance(record, Finish):
            targets[record.rid] = record.output_len
    points = by_idle_records if seen_idle_record else by_idle_before
    return TraceScan(points=points, arrivals=arrivals, targets=targets, clock=PassClock(points))


def load_input(reader: TraceReader, from_pass: int = 0, scan: TraceScan | None = None) -> LoopInput:
    """The closed loop's start: the recorded state at ``from_pass`` and what comes after."""
    count = reader.pass_count
    if count == 0:
        raise ReplayStateError(f"{reader.path}: the trace has no pass records to start a closed loop from")
    if not 0 <= from_pass < count:
        raise UsageError(f"--from {from_pass}: the trace has passes 0..{count - 1}")
    scan = scan if scan is not None else scan_trace(reader)
    start = replay_inputs(reader.pass_at(from_pass))
    # The index and the scan disagree only on a torn file: then the last point.
    start_iteration = scan.points[min(from_pass, len(scan.points) - 1)][0] if scan.points else 0
    header = reader.header
    initial = initial_state(start, scan.targets, LoopPools.of(header), page_size=max(1, header.server_args.page_size))
    known = {r.rid for r in (*initial.waiting, *initial.running)}
    if initial.chunked is not None:
        known.add(initial.chunked.rid)
    future: list[tuple[int, LoopReq]] = []
    for event in scan.arrivals:
        if event.rid in known or event.t_ns <= start.t_ns:
            continue  # already in the start state, or done with before it
        known.add(event.rid)
        step = max(1, scan.clock.iteration_at(event.t_ns) - start_iteration)
        future.append((step, _arrival_req(event, scan.targets)))
    future.sort(key=lambda item: item[0])  # stable: arrival order within a step
    return LoopInput(
        header=reader.header,
        from_pass=from_pass,
        start=start,
        initial=initial,
        arrivals=future,
        clock=scan.clock,
        start_iteration=start_iteration,
        recorded_passes=count,
    )


def _target(rid: str, max_new_tokens: int, targets: dict[str, int]) -> int:
    """Output length at which the request finishes: recorded, else its limit."""
    return max(1, targets.get(rid, max_new_tokens))


def _loop_req(
    row: Arrival | WaitingReq | RunningReq | ChunkedReq, targets: dict[str, int], **state: int | None
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


def _arrival_req(event: Arrival, targets: dict[str, int]) -> LoopReq:
    return _loop_req(event, targets, priority=event.priority)


def initial_state(
    p: Pass, targets: dict[str, int], pools: LoopPools = FULL_POOL, *, page_size: int = 1
) -> LoopState:
    """The loop state at a recorded pass's entry.

    What each request holds of the hybrid pools is not recorded: a running
    request is taken to hold its window on the SWA side (its older tokens
    already slid out) and a chunked one all it prefilled (a prefill slides
    only without a radix cache); each holds ``mamba_slots_per_req`` slots.
    """
    kv = p.kv
    swa = pools.paged_swa and kv.swa_available is not None
    mamba = pools.mamba_slots_per_req > 0 and kv.mamba_available is not None

    def held(tokens: int, window_only: bool) -> dict[str, int]:
        out = {"kv_tokens": tokens, "kv_held": tokens}
        if swa:
            out["swa_held"] = swa_window_tokens(tokens, pools.swa_window, page_size) if window_only else tokens
        if mamba:
            out["mamba_held"] = pools.mamba_slots_per_req
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
    )


def default_max_passes(loop: LoopInput, stall_passes: int) -> int:
    """A bound no healthy arm reaches: the arrivals' span plus every request's
    remaining work done one step at a time."""
    reqs = [*loop.initial.waiting, *loop.initial.running, *(r for _, r in loop.arrivals)]
    if loop.initial.chunked is not None:
        reqs.append(loop.initial.chunked)
    chunk = loop.start.chunked_prefill_size or loop.header.server_args.chunked_prefill_size or 0
    work = 0
    for r in reqs:
        work += max(r.target_output - r.output_len, 0) + 1
        if chunk > 0:
            work += -(-r.fill_len // chunk)
    last_arrival = loop.arrivals[-1][0] if loop.arrivals else 0
    return last_arrival + work + 4 * stall_passes + 64


# --------------------------------------------------------------- one arm


@dataclass
class ArmRun:
    """One arm's closed loop, step by step (``passes`` carry the decisions' outputs)."""

    arm: str
    passes: list[Pass] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    outcome: ArmOutcome | None = None

    def stall_overlapping(self, first: int, last: int) -> Stall | None:
        return next((s for s in self.stalls if s.start_pass <= last and s.end_pass >= first), None)


def run_arm(
    loop: LoopInput,
    driver,
    arm: str,
    *,
    stall_passes: int,
    max_passes: int | None = None,
) -> ArmRun:
    """Evolve ``loop.initial`` under ``arm``'s own decisions until done or ``max_passes``."""
    limit = default_max_passes(loop, stall_passes) if max_passes is None else max_passes
    run = ArmRun(arm)
    state = loop.initial.copy()
    pending = list(loop.arrivals)
    next_arrival = 0
    arrived: dict[str, int] = {r.rid: 0 for r in loop.initial.waiting}  # rid -> step it arrived
    first_admitted: dict[str, int] = {}
    over_asks = exceptions = completed = queue_peak = retractions = truncated = 0
    errors: list[ArmError] = []
    effective: list[Decision] = []  # what each pass really admitted (stall detection)
    stuck_at: int | None = None
    same_for = 0
    start = loop.start
    pools = loop.pools
    totals = state.pool_totals()
    step = idle = 0  # idle: passes with nothing to admit since the last pass record
    while step < limit:
        while next_arrival < len(pending) and pending[next_arrival][0] <= step:
            req = pending[next_arrival][1]
            state.waiting.append(replace(req))
            arrived[req.rid] = step
            next_arrival += 1
        if state.is_idle and not state.running:
            if next_arrival == len(pending):
                break  # every request finished and nothing more arrives
            # Nothing runs until the next arrival: skip straight to it.
            skip = min(pending[next_arrival][0], limit) - step
            idle += skip
            step += skip
            continue
        seq = loop.from_pass + step
        recorded = not state.is_idle
        if not recorded:
            # Nothing to admit: sglang's pass returns at once (an idle pass, as
            # the recorder counts it); the running batch decodes.
            decision = Decision(admitted=[], batch_is_full=state.batch_is_full)
            idle += 1
        else:
            queue_peak = max(queue_peak, len(state.waiting))
            p = to_pass(
                state,
                seq=seq,
                t_ns=loop.clock.time_at(loop.start_iteration + step),
                new_token_ratio=start.new_token_ratio,
                chunked_prefill_size=start.chunked_prefill_size,
                pools=pools,
            )
            p = msgspec.structs.replace(p, idle_before=idle)
            idle = 0
            decision = driver.decide(p, arm)
            run.passes.append(with_outputs(p, decision, state))
            run.decisions.append(decision)
            if decision.error is not None:
                exceptions += 1
                if len(errors) < MAX_ERRORS_LISTED:
                    errors.append(ArmError(pass_=seq, error=decision.error))
        before = state.signature()
        state, result = apply_decision(
            state, decision, page_size=loop.page_size, radix_cache=loop.radix_cache, pools=pools
        )
        _check_totals(totals, state, seq)
        if recorded:
            # A pass that failed admitted nothing, whatever the adder had picked.
            effective.append(
                msgspec.structs.replace(decision, admitted=[], chunk_size=None) if result.failed else decision
            )
        if decision.over_ask > 0 or result.kv_shortfall > 0 or result.mamba_shortfall > 0:
            over_asks += 1
        completed += len(result.finished)
        for rid in result.admitted:
            first_admitted.setdefault(rid, step)
        retractions += len(result.retracted)
        truncated += len(result.truncated)
        step += 1
        # A state that does not change decides the same again (the driver is
        # deterministic): once that has lasted longer than a stall, nothing
        # happens until the next arrival. Fold the passes up to it into this
        # one (as the recorder folds repeats), or stop if none is to come.
        same_for = same_for + 1 if state.signature() == before else 0
        if same_for > stall_passes:
            if next_arrival == len(pending):
                stuck_at = seq
                break
            skip = max(min(pending[next_arrival][0], limit) - step, 0)
            if recorded:
                last = run.passes[-1]
                run.passes[-1] = msgspec.structs.replace(last, repeat=last.repeat + skip)
                exceptions += skip if decision.error is not None else 0
                over_asks += skip if decision.over_ask > 0 or result.kv_shortfall > 0 or result.mamba_shortfall > 0 else 0
            else:
                idle += skip
            step += skip
    run.stalls = find_stalls(run.passes, effective, stall_passes, loop.header)
    left = len(state.waiting) + len(state.running) + (state.chunked is not None) + (len(pending) - next_arrival)
    run.outcome = ArmOutcome(
        stalls=len(run.stalls),
        stalled_passes=sum(s.passes for s in run.stalls),
        over_asks=over_asks,
        exceptions=exceptions,
        completed=completed,
        queue_peak=queue_peak,
        first_admission_passes={
            rid: at - arrived[rid] for rid, at in sorted(first_admitted.items()) if rid in arrived
        },
        passes=step,
        stall_runs=run.stalls,
        errors=errors,
        retractions=retractions,
        truncated_prefills=truncated,
        unfinished=left,
        stuck_at=stuck_at,
    )
    return run


def _check_totals(totals: dict[str, int], state: LoopState, seq: int) -> None:
    """The self-check: a step moves pool units between free, evictable and requests, nothing more."""
    now = state.pool_totals()
    for pool, total in totals.items():
        if now.get(pool) != total:
            raise ReplayStateError(
                f"closed loop, pass {seq}: the {pool} pool holds {now.get(pool)} units, not {total} (a loop_state bug)"
            )


# ------------------------------------------------------------------ entry


def run_closed_loop(
    path_or_reader: str | os.PathLike[str] | TraceReader,
    arms: list[str],
    from_pass: int = 0,
    stall_passes: int | None = None,
    max_passes: int | None = None,
) -> ClosedLoop:
    """Each arm's closed-loop outcome from recorded pass ``from_pass`` on."""
    runs = run_arms(path_or_reader, arms, from_pass=from_pass, stall_passes=stall_passes, max_passes=max_passes)
    return ClosedLoop(
        from_pass=from_pass,
        passes=max((r.outcome.passes for r in runs.values()), default=0),
        arms={arm: run.outcome for arm, run in runs.items()},
    )


def run_arms(
    path_or_reader: str | os.PathLike[str] | TraceReader,
    arms: list[str],
    *,
    from_pass: int = 0,
    stall_passes: int | None = None,
    max_passes: int | None = None,
    driver=None,
    loop: LoopInput | None = None,
) -> dict[str, ArmRun]:
    """``run_arm`` for every arm, sharing one trace scan and one driver."""
    from schedtrace.replay.driver import PassDriver
    from schedtrace.replay.engine import check_variants

    if not arms:
        raise UsageError("closed loop needs at least one arm")
    check_variants(*arms)
    n = DEFAULT_STALL_PASSES if stall_passes is None else stall_passes
    if n < 1:
        raise UsageError(f"stall passes must be at least 1, got {n}")
    if loop is None:
        loop = _with_reader(path_or_reader, lambda reader: load_input(reader, from_pass))
    driver = driver if driver is not None else PassDriver(loop.header)
    return {arm: run_arm(loop, driver, arm, stall_passes=n, max_passes=max_passes) for arm in dict.fromkeys(arms)}


def _with_reader(path_or_reader, use):
    if isinstance(path_or_reader, TraceReader):
        return use(path_or_reader)
    with TraceReader(path_or_reader) as reader:
        return use(reader)
