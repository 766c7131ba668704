"""``schedtrace repro TRACE --pass N``: find, shrink, emit, verify, in that order.

``build`` finds the divergences at the pass, shrinks each with the real
sglang code and writes the module's text; ``predict`` says, from the
replay's own decisions on the shrunk state, under which variants it should
pass; ``verify`` runs the module in pytest processes (stock, each fix alone,
and the fix set when it has several) and compares every run with that.
Only a module that fails on stock and passes with its fix is ever written
(``schedtrace.cli.repro`` writes it after ``verify`` returns).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from schedtrace.replay.driver import PassDriver
from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.replay.hybrid import FULL, pool_family
from schedtrace.replay.repro.emit import Case, emit_module, expected_to_pass
from schedtrace.replay.repro.probe import Oracle, Probe
from schedtrace.replay.repro.shrink import describe, shrink_aiter, shrink_pass
from schedtrace.replay.repro.target import Divergent, find_divergences
from schedtrace.replay.repro.verify import FAILED, PASSED, Run, run_variants
from schedtrace.arms.variants import parse_variant, variant_label
from schedtrace.tracer.contract.errors import ReproError, UsageError
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.names import STOCK


@dataclass(frozen=True)
class Repro:
    """The emitted module before verification."""

    cases: list[Case]
    text: str
    calls: int  # real-code calls made to find and shrink
    fixes: str  # the variant the module passes with (the union of its cases' fix sets)


def shrink_divergent(d: Divergent, oracle: Oracle) -> Case:
    if not d.is_aiter and pool_family(d.header) != FULL:
        raise UsageError("repro writes tests for single-pool traces; this one has hybrid (SWA or mamba) pools")
    probe = Probe(oracle, d.fixes, frozenset(d.kinds))
    shrunk = shrink_aiter(d.subject, probe.holds) if d.is_aiter else shrink_pass(d.subject, probe.holds)
    stock, fixed = probe.decisions(shrunk)
    return Case(d, shrunk, describe(d.subject, shrunk), stock, fixed)


def _union(fix_sets: list[str]) -> str:
    return variant_label(frozenset().union(*(parse_variant(f) for f in fix_sets)))


def build(trace: str | os.PathLike[str], pass_n: int, *, kind: str | None = None, fix: str | None = None) -> Repro:
    """Find and shrink the divergences at ``pass_n`` and emit their module."""
    with TraceReader(trace) as reader:
        oracle = Oracle(PassDriver(reader.header))
    found = find_divergences(trace, pass_n, kind=kind, fix=fix, oracle=oracle)
    cases = [shrink_divergent(d, oracle) for d in found]
    return Repro(cases, emit_module(cases), oracle.calls, _union([c.divergent.fixes for c in cases]))


def variants_for(own: str) -> list[str]:
    """What verification runs: stock, each fix alone, then ``own`` if it is a set of several."""
    return [STOCK, *FIX_NAMES] + ([own] if own not in FIX_NAMES else [])


@dataclass(frozen=True)
class Verdict:
    """The pytest runs and what the replay predicted for each."""

    runs: list[Run]
    predicted: dict[str, str]  # variant -> PASSED | FAILED
    own: str  # the variant the module is for

    @property
    def problems(self) -> list[str]:
        out = []
        for run in self.runs:
            want = self.predicted[run.variant]
            if run.outcome != want:
                why = f" ({run.detail})" if run.detail else ""
                out.append(f"under {run.variant} it {run.outcome}, the replay predicts it {want}{why}")
        return out


def verify(module: Path, predicted: dict[str, bool], own: str, *, jobs: int = 2,
           extra_files: tuple[Path, ...] = ()) -> Verdict:
    """Run ``module`` under every predicted variant; ``ReproError`` unless it fails on stock,
    passes with ``own`` and does what the replay predicts under every other variant."""
    if predicted[STOCK] or not predicted[own]:
        raise ReproError(f"the shrunk case does not separate stock from {own} (a repro bug)")
    expected = {v: PASSED if ok else FAILED for v, ok in predicted.items()}
    verdict = Verdict(run_variants([module], list(predicted), jobs=jobs, extra_files=extra_files), expected, own)
    if verdict.problems:
        raise ReproError(f"{module.name} not written: " + "; ".join(verdict.problems))
    return verdict


def predict(repro: Repro) -> dict[str, bool]:
    """Per variant, whether every test of the module passes, from the replay's own decisions."""
    oracle = Oracle(PassDriver(repro.cases[0].divergent.header))
    return {
        v: all(expected_to_pass(c, oracle.decide(c.subject, v)) for c in repro.cases)
        for v in variants_for(repro.fixes)
    }
