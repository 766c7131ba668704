"""What ``schedtrace ranks --json`` writes (docs/ranks.md): whether the ranks of one run agreed,
and where they first did not."""

from __future__ import annotations

from typing import Any, Final

import msgspec

RANKS_VERSION: Final = 1


class ValueGroup(msgspec.Struct):
    """Ranks that hold the same value of one field."""

    ranks: list[str]
    value: Any


class FieldDiff(msgspec.Struct):
    field: str  # a path: waiting[3].prefix_len, kv.available, decision.admitted
    side: str  # "input" | "output" | "header"
    values: list[ValueGroup]  # every value once, the reference ranks' first


class RankDiff(msgspec.Struct, kw_only=True):
    """Ranks of one group that differ, from pass clock ``clock`` for ``points`` compared points."""

    group: str
    clock: int  # scheduler pass (on the pass clock) where it starts
    until: int  # the last pass clock of this run of the same difference
    points: int
    t_ns: int | None  # the reference ranks' pass time at ``clock`` (None: they were idle)
    kind: str  # "inputs": the inputs differed already; "decision": same inputs, other decision
    odd: list[str]  # ranks outside the reference (largest, then lowest) group
    reference: list[str]
    passes: dict[str, int | None]  # each rank's pass seq at ``clock`` (None: idle)
    fields: list[FieldDiff]


class RankFacts(msgspec.Struct, kw_only=True):
    rank: str
    group: str
    files: list[str]  # file names, in part order
    pass_records: int
    clock: int  # scheduler passes the trace covers
    closed_cleanly: bool
    lost: int  # records the recorder dropped
    lost_at: int | None  # pass clock of the first loss (compared up to there)


class GroupFacts(msgspec.Struct, kw_only=True):
    group: str
    ranks: list[str]
    compared_until: int  # pass clock up to which at least two of its ranks were compared
    differing_points: int
    agree: bool


class DpCell(msgspec.Struct, kw_only=True):
    """One DP rank over one row of the timeline."""

    rank: str
    passes: int  # scheduler passes (how far its pass clock moved)
    idle: int  # of them idle: nothing waiting, no chunked request
    waiting_mean: float  # over the passes with a record
    waiting_max: int
    running_mean: float  # over the passes with a record (an idle pass records no batch)
    admitted: int  # requests admitted (a continuing chunk counts)
    admitted_tokens: int  # extend tokens admitted


class DpRow(msgspec.Struct, kw_only=True):
    t_ns: int  # row start, since the run's earliest start
    cells: list[DpCell]
    idle_ranks: list[str]  # ranks whose passes in the row were all idle
    running_imbalance: float  # max / mean of running_mean over the ranks (1.0: balanced)
    waiting_imbalance: float


class Lockstep(msgspec.Struct, kw_only=True):
    """DP attention all-gathers every pass: the ranks' pass clocks must end together."""

    clocks: dict[str, int]
    exact: bool  # every rank closed cleanly and lost nothing, so the clocks are complete
    skew: int  # highest minus lowest clock
    broken: bool  # exact and skew > LOCKSTEP_SLACK (schedtrace.tracer.analysis.ranks)


class DpReport(msgspec.Struct, kw_only=True):
    ranks: list[str]  # one rank per DP group
    bucket_ns: int
    rows: list[DpRow]
    lockstep: Lockstep | None  # DP attention only
    not_in_trace: list[str]


class RanksReport(msgspec.Struct, kw_only=True):
    version: int = RANKS_VERSION
    run: str
    mode: str  # "tp" | "dp-attention" | "dp"
    verdict: str  # "agree" | "desync"
    ranks: list[RankFacts]
    groups: list[GroupFacts]
    header_diffs: list[FieldDiff]
    first: RankDiff | None
    later: list[RankDiff]
    later_total: int  # later differences found (``later`` lists at most MAX_LISTED)
    dp: DpReport | None
    notes: list[str]
