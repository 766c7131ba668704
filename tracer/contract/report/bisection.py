"""What ``schedtrace bisect --json`` writes (docs/repro.md): each stock stall, where the fixed
logic first decided otherwise, and the smallest set of fixes that removes it."""

from __future__ import annotations

from typing import Final

import msgspec

from schedtrace.tracer.contract.report.run import Decision, Holes, Stall

BISECT_VERSION: Final = 1


class FirstDivergence(msgspec.Struct, kw_only=True, rename={"pass_": "pass"}):
    pass_: int
    kinds: list[str]
    stock: Decision
    fixed: Decision


class StallFinding(msgspec.Struct, kw_only=True):
    mode: str  # "open-loop" | "closed-loop"
    stall: Stall  # onset = stall.start_pass
    first_divergence: FirstDivergence | None
    reproduced: bool  # stock stalls in the closed loop the fix sets are tried in
    fix_set: list[str] | None  # smallest set of fixes that removes it; None: none does / not searched
    tried: list[str]  # subsets tried, in order (comma lists)


class BisectReport(msgspec.Struct, kw_only=True):
    version: int = BISECT_VERSION
    trace: str
    sglang_version: str
    trace_sglang_version: str
    stall_passes: int
    from_pass: int  # closed-loop start
    fixes: list[str]  # the fixes searched, in name order
    open_loop: list[StallFinding]
    closed_loop: list[StallFinding]
    retried_tasks: int = 0  # tasks a distributed backend (--ray) ran again after their worker died
    holes: Holes = msgspec.field(default_factory=Holes)  # unreadable regions and loss records of the trace

    @property
    def findings(self) -> list[StallFinding]:
        return [*self.open_loop, *self.closed_loop]


_json_encoder = msgspec.json.Encoder(order="sorted")


def dump_bisect(report: BisectReport) -> bytes:
    """Deterministic JSON bytes (sorted keys, trailing newline)."""
    return msgspec.json.format(_json_encoder.encode(report), indent=2) + b"\n"


