"""A replay report looked up by pass number."""

from __future__ import annotations

from schedtrace.tracer.contract.report import Divergence, Mismatch, Report


class ReplayIndex:
    """The report's divergences, errors and fidelity mismatches by pass number."""

    def __init__(self, report: Report | None = None) -> None:
        self.report = report
        self.divergences: dict[int, Divergence] = {}
        self.fixes: set[str] = set()
        self._mismatches: dict[int, Mismatch] | None = None
        if report is not None:
            for d in report.divergences:
                self.add(d)

    def add(self, divergence: Divergence) -> None:
        self.divergences[divergence.pass_] = divergence
        self.fixes.update(divergence.fixes)

    def mismatch_at(self, n: int) -> Mismatch | None:
        if self.report is None:
            return None
        if self._mismatches is None:  # first one per pass, as a linear search would find
            self._mismatches = {}
            for m in self.report.fidelity.mismatches:
                self._mismatches.setdefault(m.pass_, m)
        return self._mismatches.get(n)

    def stall_runs(self) -> dict[str, list[tuple[int, int]]]:
        """Each arm's stalls, the old arm first, then the new one (then any other the report names)."""
        if self.report is None:
            return {}
        report = self.report
        arms = [report.old, report.new, *sorted(set(report.stalls) - {report.old, report.new})]
        return {arm: [(s.start_pass, s.end_pass) for s in report.stalls.get(arm, [])] for arm in arms}

    def error_passes(self) -> list[int]:
        if self.report is None:
            return []
        return [e.pass_ for errors in self.report.errors.values() for e in errors]
