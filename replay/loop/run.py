"""Closed-loop (counterfactual) replay: what would have happened under each arm.

Open-loop replay asks every arm about the *recorded* states. Here each arm
starts from the recorded state at pass ``from_pass`` and lives with its own
decisions: ``schedtrace.replay.loop.state`` moves the state one scheduling step at a
time, ``schedtrace.replay.driver.PassDriver`` decides each step with the real sglang
code. Requests arrive at their recorded times (``arrive`` events, mapped to
steps with the recorded pass clock, idle and folded passes included) and
finish at their recorded output lengths (``finish`` events).

Closed-loop pass numbers continue from ``from_pass``: pass ``from_pass + k``
is the k-th scheduling step after it. Everything is deterministic: the same
trace and arms give the same result.

On a hybrid trace every pool evolves (``schedtrace.replay.loop.pools``: the
SWA side, the mamba state slots), and every step checks that no pool made or
lost a unit (``LoopState.pool_totals``): a failed check is a model bug and
raises ``ReplayStateError`` naming the pool and the pass.

With a stock arm, ``run_closed_loop`` also checks that arm against the
recording (``schedtrace.replay.loop.selfcheck``: first-admission waits, queue
peak, completion order) into ``ClosedLoop.self_check``.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import msgspec

from schedtrace.replay.loop.arm_tree import ArmTree
from schedtrace.replay.loop.feed import ArrivalFeed
from schedtrace.replay.loop.micro_batches import rotate
from schedtrace.replay.loop.input import LoopInput, initial_state, load_input  # re-exported: bisect and repro
from schedtrace.replay.loop.scan import TraceScan, scan_trace  # build on them
from schedtrace.replay.loop.state import LoopState, abort_chunked, apply_decision, to_pass, with_outputs
from schedtrace.replay.loop.clock import PassClock
from schedtrace.replay.loop.selfcheck import self_check
from schedtrace.tracer.analysis.stalls import find_stalls
from schedtrace.tracer.contract.errors import ReplayStateError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES, STOCK
from schedtrace.tracer.contract.report import ArmError, ArmOutcome, ClosedLoop, Decision, Stall
from schedtrace.tracer.contract.report.run import PREFIX_MATCHES_RECORDED, PREFIX_MATCHES_TREE
from schedtrace.tracer.contract.schema import Pass, Retract

__all__ = [
    "ArmRun", "LoopInput", "PassClock", "TraceScan", "default_max_passes", "initial_state", "load_input",
    "run_arm", "run_arms", "run_closed_loop", "scan_trace",
]

MAX_ERRORS_LISTED: Final = 20  # per arm; ``exceptions`` still counts them all


# --------------------------------------------------------------- one arm


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


@dataclass
class ArmRun:
    """One arm's closed loop, step by step (``passes`` carry the decisions' outputs)."""

    arm: str
    passes: list[Pass] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    outcome: ArmOutcome | None = None
    finished_at: dict[str, int] = field(default_factory=dict)  # rid -> step it finished (completion order)

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
    # Each request's prefix ids, arrival stamp and queue entry time, as of the recorded start
    driver.start_over([*loop.arrival_records, *loop.requeued_before])
    state = loop.initial.copy()
    feed = ArrivalFeed(loop)
    first_admitted: dict[str, int] = {}
    over_asks = exceptions = completed = queue_peak = retractions = truncated = 0
    errors: list[ArmError] = []
    effective: list[Decision] = []  # what each pass really admitted (stall detection)
    stuck_at: int | None = None
    same_for = 0
    pools = loop.pools
    ratio, retract_every, retraction = loop.ratio_rule, loop.retract_every, loop.retraction
    chunk_sizes = loop.chunk_sizes
    totals = state.pool_totals()
    # Ties only the server's tree or text could break: dfs-weight's branch order
    # (schedtrace.replay.loop.tree_order), routing-key's key text (schedtrace.replay.routing_keys)
    tie_order = loop.tie_order.for_arm(state) if loop.tie_order is not None else None
    tree = ArmTree.for_arm(loop, state)  # the prefix matches of this arm's own tree (None: the recording's)
    step = idle = 0  # idle: passes with nothing to admit since the last pass record
    turns = len(state.parked) + 1  # micro-batches: a state recurs after a round of them
    entries: deque[tuple] = deque(maxlen=turns)  # the last round's entry signatures
    while step < limit:
        feed.feed(state, step)
        if tree is not None:
            tree.match(state, step)
        while feed.left:  # aborted or rejected while waiting: it ends here, unrun
            run.finished_at.setdefault(feed.left.pop(), step)
        if feed.chunk_aborted is not None:
            state = abort_chunked(state, page_size=loop.page_size, radix_cache=loop.radix_cache, pools=pools)
            run.finished_at.setdefault(feed.chunk_aborted, step)
            feed.chunk_aborted = None
        if state.is_empty:
            if feed.next_arrival is None:
                break  # every request finished and nothing more arrives
            # Nothing runs until the next arrival: skip straight to it.
            skip = min(feed.next_arrival, limit) - step
            idle += skip
            state.new_token_ratio = ratio.init  # the idle scheduler resets it (on_idle)
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
                new_token_ratio=state.new_token_ratio,
                chunked_prefill_size=chunk_sizes.static_size,
                pools=pools,
                processed_tokens=loop.processed_at(loop.start_iteration + step),
            )
            if chunk_sizes.dynamic:
                p = msgspec.structs.replace(p, chunked_prefill_size=chunk_sizes.size(p.chunked))
            order = loop.draws.order_at(loop.start_iteration + step, p.waiting) if loop.draws else None
            if order is None and tie_order is not None:
                order = tie_order.queue_order(p.waiting)
            p = msgspec.structs.replace(p, idle_before=idle, order=order)
            idle = 0
            decision = _decide(driver, p, arm, state)
            run.passes.append(with_outputs(p, decision, state))
            run.decisions.append(decision)
            if decision.error is not None:
                exceptions += 1
                if len(errors) < MAX_ERRORS_LISTED:
                    errors.append(ArmError(pass_=seq, error=decision.error))
        entries.append(state.signature())
        state, result = apply_decision(
            state, decision, page_size=loop.page_size, radix_cache=loop.radix_cache, pools=pools,
            mixed_chunk=loop.mixed_chunk, overlap=loop.overlap, retract_every=retract_every, ratio=ratio,
            prefix_block=loop.header.prefix_block, retraction=retraction,
        )
        _check_totals(totals, state, seq)
        rotate(state)
        if tie_order is not None:
            tie_order.landed(state)
        if tree is not None:
            tree.landed(state, result.finished)
        if recorded:
            # A pass that failed admitted nothing, whatever the adder had picked.
            effective.append(
                msgspec.structs.replace(decision, admitted=[], chunk_size=None) if result.failed else decision
            )
        if decision.over_ask > 0 or result.kv_shortfall > 0 or result.mamba_shortfall > 0:
            over_asks += 1
        completed += len(result.finished)
        for rid in result.finished:
            run.finished_at.setdefault(rid, step)
        for rid in result.admitted:
            first_admitted.setdefault(rid, step)
        retractions += len(result.retracted)
        if result.retracted:
            # _add_request_to_queue stamps a retracted request's queue entry after this pass's
            # preemption releases (ranked by it, they and the priority queue read it)
            at = loop.clock.time_at(loop.start_iteration + step) + 1
            for rid in result.retracted:
                driver.note(Retract(t_ns=at, rid=rid, output_len=0))
        truncated += len(result.truncated)
        step += 1
        # A state that does not change decides the same again (the driver is
        # deterministic): once that has lasted longer than a stall, nothing
        # happens until the next arrival (or prefix match). Fold the passes up
        # to it into this one (as the recorder folds repeats), or stop if none is to come.
        same_for = same_for + 1 if len(entries) == turns and state.signature() == entries[0] else 0
        if same_for > stall_passes:
            next_event = feed.next_event(state)
            if next_event is None:
                stuck_at = seq
                break
            skip = max(min(next_event, limit) - step, 0)
            skip -= skip % turns  # whole rounds: the same micro-batch's turn comes next
            if recorded:
                last = run.passes[-1]
                run.passes[-1] = msgspec.structs.replace(last, repeat=last.repeat + skip)
                exceptions += skip if decision.error is not None else 0
                over_asks += skip if decision.over_ask > 0 or result.kv_shortfall > 0 or result.mamba_shortfall > 0 else 0
            else:
                idle += skip
            step += skip
    run.stalls = find_stalls(run.passes, effective, stall_passes, loop.header)
    left = len(state.waiting) + len(state.running) + (state.chunked is not None) + feed.to_arrive
    run.outcome = ArmOutcome(
        stalls=len(run.stalls),
        stalled_passes=sum(s.passes for s in run.stalls),
        over_asks=over_asks,
        exceptions=exceptions,
        completed=completed,
        queue_peak=queue_peak,
        first_admission_passes={
            rid: at - feed.arrived[rid] for rid, at in sorted(first_admitted.items()) if rid in feed.arrived
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


def _decide(driver, p: Pass, arm: str, state: LoopState) -> Decision:
    """The arm's decision on a loop state; a preemption frees what the loop's request holds,
    and the request re-enters the queue at the pass's end (its entry time ranks the next one)."""
    if not driver.scheduler.enable_priority_preemption:
        return driver.decide(p, arm)
    decision = driver.decide(p, arm, frees={r.rid: r.kv_held for r in state.running})
    if decision.released:
        driver.requeue_released(p, decision.released)
    return decision


def _check_totals(totals: dict[str, int], state: LoopState, seq: int) -> None:
    """The pool check: a step moves pool units between free, evictable and requests, nothing more."""
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
    """Each arm's closed-loop outcome from recorded pass ``from_pass`` on; with a
    stock arm, its self-check against the recording (``ClosedLoop.self_check``).

    ``path_or_reader``: a path, or anything with the ``TraceReader`` interface
    (a ``RankTrace`` of several parts)."""
    scan, loop = _with_reader(path_or_reader, lambda reader: _scan_and_load(reader, from_pass))
    runs = run_arms(None, arms, stall_passes=stall_passes, max_passes=max_passes, loop=loop)
    return closed_loop_report(loop, scan, runs)


def closed_loop_report(loop: LoopInput, scan: TraceScan, runs: dict[str, ArmRun]) -> ClosedLoop:
    """The report of arms run from ``loop``; the self-check when one of them is stock."""
    stock = runs.get(STOCK)
    return ClosedLoop(
        from_pass=loop.from_pass,
        passes=max((r.outcome.passes for r in runs.values()), default=0),
        arms={arm: run.outcome for arm, run in runs.items()},
        self_check=self_check(loop, scan, stock.outcome, stock.finished_at) if stock is not None else None,
        prefix_matches=PREFIX_MATCHES_TREE if ArmTree.applies(loop) else PREFIX_MATCHES_RECORDED,
    )


def _scan_and_load(reader: TraceReader, from_pass: int) -> tuple[TraceScan, LoopInput]:
    scan = scan_trace(reader)
    return scan, load_input(reader, from_pass, scan)


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
    if not isinstance(path_or_reader, (str, os.PathLike)):
        return use(path_or_reader)  # a TraceReader, or a RankTrace with its interface
    with TraceReader(path_or_reader, skip_damaged=True) as reader:  # past unreadable regions, as replay reads
        return use(reader)
