"""Replay one rank per agreeing TP group; the others' reports follow from it.

The TP ranks of one group run the same scheduler on the same broadcast input,
and ``schedtrace ranks`` (``tracer.analysis.ranks.compare_ranks``) checks, pass
by pass on the pass clock, that their recorded inputs and decisions are equal.
What else a replay reads (the header, and the arrival, finish, retract and aiter
records behind the driver's state) is compared here, as one digest per rank
without its times. A rank equal to its group's first rank in all of that would
replay to the same report, so that rank's report stands for it
(``Report.same_as`` names it, ``Report.same_as_why`` says why).

A rank is replayed itself when anything leaves the equality unproven: its group
disagreed, the headers differ, it lost records or did not close cleanly, its
pass count or clock differs, or its events do. DP ranks are different groups,
each replayed. The check reads every rank once or twice; a replay costs far
more per pass (docs/performance.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from schedtrace.tracer.analysis.ranks import compare_ranks
from schedtrace.tracer.contract.report import RankFacts
from schedtrace.tracer.contract.report import Report
from schedtrace.tracer.contract.schema import Abort, Aiter, Arrival, Finish, Retract
from schedtrace.tracer.contract.traceset import RankTrace

_EVENTS = (Arrival, Finish, Abort, Retract, Aiter)  # what a replay reads beside passes and the header
_TIMES = frozenset(("t_ns", "pass_seq"))  # differ between agreeing ranks by nature (when, and how repeats folded)
_encode = msgspec.msgpack.Encoder().encode


@dataclass
class RankPlan:
    """Which ranks to replay; each other rank's report is a copy of ``same_as[label]``'s."""

    replayed: list[RankTrace]
    same_as: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)


def events_digest(rank: RankTrace) -> str:
    """A hash of every record a replay reads beside passes, without its times."""
    digest = hashlib.blake2b(digest_size=16)
    for _, record in rank.records():
        kind = type(record)
        if kind in _EVENTS:
            values = [v for name, v in zip(record.__struct_fields__, msgspec.structs.astuple(record))
                      if name not in _TIMES]
            digest.update(_encode((kind.__name__, values)))
    return digest.hexdigest()


def _complete_twins(a: RankFacts, b: RankFacts) -> bool:
    """Both traces whole and of one length: the agreement covers every pass of both."""
    return (a.closed_cleanly and b.closed_cleanly and not a.lost and not b.lost
            and a.pass_records == b.pass_records and a.clock == b.clock)


def plan_ranks(ranks: Sequence[RankTrace], *, run: str) -> RankPlan:
    """One rank per agreeing group replayed; every rank replayed where the set proves nothing."""
    ranks = list(ranks)
    if len(ranks) < 2:
        return RankPlan(ranks)
    report = compare_ranks(ranks, run=run)
    if report.header_diffs:
        return RankPlan(ranks)
    facts = {f.rank: f for f in report.ranks}
    by_label = {r.label: r for r in ranks}
    plan = RankPlan([])
    for group in report.groups:
        if not group.agree or len(group.ranks) < 2:
            continue
        first = group.ranks[0]
        candidates = [r for r in group.ranks[1:] if _complete_twins(facts[first], facts[r])]
        if not candidates:
            continue
        reference = events_digest(by_label[first])
        for label in candidates:
            if events_digest(by_label[label]) == reference:
                plan.same_as[label] = first
                plan.why[label] = (
                    f"not replayed: {label} agreed with {first} on every one of its {facts[label].pass_records} "
                    f"pass records (inputs and decisions, schedtrace ranks), on the header and on every arrival, abort, "
                    f"finish, retract and aiter event; the replay reads nothing else, so {first}'s replay is "
                    f"{label}'s, and so is its fidelity")
    plan.replayed = [r for r in ranks if r.label not in plan.same_as]
    return plan


def copied_report(reference: Report, rank: RankTrace, same_as: str, why: str) -> Report:
    """``reference``'s report as ``rank``'s: its own file, the replayed rank and the reason."""
    return msgspec.structs.replace(reference, trace=rank.path, trace_fingerprint=rank.fingerprint(),
                                   same_as=same_as, same_as_why=why)
