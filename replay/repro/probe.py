"""The oracle every shrinking step asks: the real sglang code under stock and under the fix.

A ``Probe`` decides a pass (``PassDriver.decide``) or an aiter event
(``PassDriver.decide_aiter``) under ``stock`` and under the fix set, and says
whether the divergence still has every kind it had. Answers are memoised by
the subject's bytes, so a state seen twice costs no second call; the
``Oracle`` counts the real-code calls made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from schedtrace.replay.differ import divergence_kinds
from schedtrace.replay.driver import PassDriver
from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.names import STOCK, error_text
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import Aiter, Pass

Subject = Pass | Aiter


def decide(driver: PassDriver, subject: Subject, variant: str) -> Decision:
    """What the real code decides on ``subject`` under ``variant``; a raise is the outcome."""
    if isinstance(subject, Aiter):
        try:
            return Decision(admitted=[], aiter_method=driver.decide_aiter(subject, variant))
        except ReplayStateError as exc:
            return Decision(admitted=[], error=f"ReplayStateError: {exc}")
        except Exception as exc:  # the real handler raised: that arm's outcome
            return Decision(admitted=[], error=error_text(exc))
    try:
        return driver.decide(subject, variant)
    except ReplayStateError as exc:
        return Decision(admitted=[], error=f"ReplayStateError: {exc}")


def replayable(decision: Decision) -> bool:
    return decision.error is None or not decision.error.startswith("ReplayStateError")


@dataclass
class Oracle:
    """``decide`` on one trace's driver, counting the real-code calls."""

    driver: PassDriver
    calls: int = 0

    def decide(self, subject: Subject, variant: str) -> Decision:
        self.calls += 1
        return decide(self.driver, subject, variant)


@dataclass
class Probe:
    """Does the divergence of ``kinds`` between stock and ``fixes`` survive on a subject?"""

    oracle: Oracle
    fixes: str  # a variant: one fix or a comma list
    kinds: frozenset[str]
    _seen: dict[bytes, tuple[Decision, Decision]] = field(default_factory=dict)

    def decisions(self, subject: Subject) -> tuple[Decision, Decision]:
        """(stock, fix) decisions on ``subject``."""
        key = msgspec.msgpack.encode(subject)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = (self.oracle.decide(subject, STOCK), self.oracle.decide(subject, self.fixes))
        return found

    def holds(self, subject: Subject) -> bool:
        stock, fixed = self.decisions(subject)
        if not (replayable(stock) and replayable(fixed)):
            return False
        return self.kinds <= set(divergence_kinds(stock, fixed))
