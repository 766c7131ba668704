"""The divergence ``repro`` starts from: a pass of the replay report, or the aiter event after it.

``--pass N`` is ``divergences[].pass`` of the replay report: a pass record's
``seq``, and for an aiter event the last pass written before it. Both arms
are the report's defaults, stock against fixed; ``fixes`` is the fix that
reproduces the fixed decision alone (the report's ``fixes``), or else the
smallest set of fixes that does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from schedtrace.replay.bisect import fix_subsets
from schedtrace.replay.differ import divergence_kinds
from schedtrace.replay.driver import PassDriver
from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.replay.repro.probe import Oracle, Subject
from schedtrace.arms.variants import parse_variant, variant_label
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.contract.errors import UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import FIXED, STOCK
from schedtrace.tracer.contract.report import DIVERGENCE_KINDS, KIND_AITER as AITER, Decision
from schedtrace.tracer.contract.schema import Aiter, Header, Pass


@dataclass(frozen=True)
class Divergent:
    """One divergence to reproduce."""

    trace: str
    header: Header
    pass_: int  # as the replay report numbers it
    subject: Subject  # the pass (its replay inputs) or the aiter event
    kinds: tuple[str, ...]
    fixes: str  # the fix set the test is for (a variant: one name or a comma list)
    alone: tuple[str, ...]  # every fix that alone reproduces the fixed decision
    stock: Decision
    fixed: Decision

    @property
    def is_aiter(self) -> bool:
        return isinstance(self.subject, Aiter)


def _records_at(reader: TraceReader, pass_n: int) -> tuple[Pass, list[Aiter]]:
    """The pass record numbered ``pass_n`` and the aiter events written after it, before the next pass."""
    first = reader.header.first_pass
    count = reader.pass_count
    if not first <= pass_n < first + count:
        raise UsageError(f"--pass {pass_n}: the trace has passes {first}..{first + count - 1}")
    found: Pass | None = None
    events: list[Aiter] = []
    for _, record in reader.records(reader.pass_offsets[pass_n - first]):
        if isinstance(record, Pass):
            if found is not None:
                break
            found = record
        elif isinstance(record, Aiter) and record.pass_seq == pass_n:
            events.append(record)
    if found is None or found.seq != pass_n:
        raise UsageError(f"--pass {pass_n}: no pass record with that number (the index points elsewhere)")
    return found, events


def _responsible(oracle: Oracle, subject: Subject, fixed: Decision) -> tuple[tuple[str, ...], str]:
    """(fixes that alone reproduce ``fixed``, the first of them or else the smallest set that does)."""
    alone = tuple(f for f in FIX_NAMES if not divergence_kinds(oracle.decide(subject, f), fixed))
    if alone:
        return alone, alone[0]
    for subset in fix_subsets(list(FIX_NAMES)):
        if len(subset) > 1 and not divergence_kinds(oracle.decide(subject, ",".join(subset)), fixed):
            return alone, variant_label(frozenset(subset))
    return alone, FIXED  # only all four together: the fixed arm itself


def _divergent(trace: str, oracle: Oracle, pass_n: int, subject: Subject, fix: str | None) -> Divergent | None:
    """The divergence on ``subject``; ``fixes`` is empty when ``fix`` does not reproduce it."""
    stock = oracle.decide(subject, STOCK)
    fixed = oracle.decide(subject, FIXED)
    kinds = tuple(divergence_kinds(stock, fixed))
    if not kinds:
        return None
    alone, chosen = _responsible(oracle, subject, fixed)
    if fix is not None:
        chosen = variant_label(parse_variant(fix))
        if divergence_kinds(oracle.decide(subject, chosen), fixed):
            chosen = ""
    return Divergent(trace, oracle.driver.header, pass_n, subject, kinds, chosen, alone, stock, fixed)


def find_divergences(
    trace: str | os.PathLike[str], pass_n: int, *, kind: str | None = None, fix: str | None = None,
    oracle: Oracle | None = None,
) -> list[Divergent]:
    """The divergences at ``pass_n`` to reproduce: the pass's, then its aiter event's.

    ``kind`` keeps one: ``aiter`` the aiter event, another kind the pass if it
    diverges in that kind. ``fix`` names the fix set the test is for; it must
    reproduce the fixed decision. Anything else is a ``UsageError``.
    """
    if kind is not None and kind not in DIVERGENCE_KINDS:
        raise UsageError(f"--kind {kind!r}: valid kinds are {', '.join(DIVERGENCE_KINDS)}")
    with TraceReader(trace) as reader:
        record, events = _records_at(reader, pass_n)
        oracle = oracle if oracle is not None else Oracle(PassDriver(reader.header))
    subjects: list[Subject] = []
    if kind != AITER:
        subjects.append(replay_inputs(record))
    if kind in (None, AITER):
        subjects += events
    found = [d for s in subjects if (d := _divergent(str(trace), oracle, pass_n, s, fix)) is not None]
    if kind not in (None, AITER):
        found = [d for d in found if kind in d.kinds]
    if not found:
        what = f" of kind {kind}" if kind is not None else ""
        raise UsageError(f"pass {pass_n}: no divergence{what} between stock and fixed")
    wrong = [d for d in found if not d.fixes]
    if wrong and len(wrong) == len(found):
        d = wrong[0]
        causes = ", ".join(d.alone) or "none alone"
        raise UsageError(f"pass {pass_n}: fix {fix!r} does not cause the divergence ({', '.join(d.kinds)}); "
                         f"the fixes that do: {causes}")
    found = [d for d in found if d.fixes]
    # The first aiter event of the pass stands for the rest (they differ only in lengths).
    aiters = [d for d in found if d.is_aiter]
    return [d for d in found if not d.is_aiter] + aiters[:1]
