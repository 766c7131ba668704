"""Did the ranks of one run agree? The data behind ``schedtrace ranks`` (docs/ranks.md).

Plain TP: sglang broadcasts each request from rank 0 and every rank runs its
own scheduler on the same input, so every rank must decide the same on every
pass; where two do not, their collectives disagree on shape and the job
hangs. The ranks' passes are aligned on the pass clock (``digest``) and
compared whole in one streaming read; only where they differ is the
difference spelt out: which ranks, which fields with both values, and whether
the inputs already differed (the cause lies upstream of the scheduler) or
only the decision did (a scheduler non-determinism).

DP attention and DP: each DP rank schedules its own requests, so only the
ranks inside one attention-TP (or TP) group must agree. The DP ranks are
shown side by side over time (``timeline``); under DP attention every pass
all-gathers the batch facts across them, so their pass clocks must advance
together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from schedtrace.tracer.analysis import digest
from schedtrace.tracer.analysis.digest import ClockState, Segment, merged
from schedtrace.tracer.contract.errors import TraceSetError
from schedtrace.tracer.contract.report import (
    DpCell, DpReport, DpRow, FieldDiff, GroupFacts, Lockstep, RankDiff, RankFacts, RanksReport, ValueGroup,
)
from schedtrace.tracer.contract.schema import Header
from schedtrace.tracer.contract.traceset import RankTrace

MAX_LISTED: Final = 50  # later differences listed (all are counted)
DEFAULT_ROWS: Final = 24  # rows of the DP side-by-side timeline
ROW_SLACK: Final = 4  # a timeline grows to this many times its rows, then counts later passes in its last
# A kill between two ranks' pass hooks of the same pass leaves their clocks one apart.
LOCKSTEP_SLACK: Final = 1
NOT_IN_TRACE: Final = (
    "the batch each pass ran: decode-only passes are recorded as idle or rejected passes, so the forward "
    "mode and token count sglang all-gathers are known only for passes that admitted work",
    "num_tokens_for_logprob and the CUDA-graph and two-batch-overlap votes",
    "the running batch during idle passes (nothing waiting, no chunked request)",
)
# Every Header field is in one of these (tests/test_ranks.py checks): what names the process and its
# place, and what every rank of a run must share (a difference there is a desync before any pass).
IDENTITY_FIELDS: Final = ("host", "pid", "start_wall_ns", "part", "first_pass", "run_id", "tp_rank", "dp_rank",
                          "pp_rank", "attn_tp_rank", "attn_dp_rank")
SHARED_FIELDS: Final = ("schema_version", "sglang_version", "schedtrace_version", "server_args", "max_req_slots",
                        "is_hybrid_swa", "is_hybrid_mamba", "mamba_chunk_grid", "pools", "exact_chunk_fill",
                        "tp_size", "dp_size", "pp_size", "attn_tp_size", "attn_dp_size", "overlap_schedule",
                        "prefix_block", "settings", "chunk_sizer")


def run_mode(headers: Sequence[Header]) -> str:
    if any(h.attn_dp_size > 1 for h in headers):
        return "dp-attention"
    if len({h.dp_rank or 0 for h in headers}) > 1:
        return "dp"
    return "tp"


def group_name(header: Header, mode: str) -> str:
    """The group of ranks that must agree with each other."""
    stage = f"pp{header.pp_rank} " if header.pp_size > 1 or header.pp_rank else ""
    if mode == "dp-attention":
        return f"{stage}attn-dp {header.attn_dp_rank or 0}"
    if mode == "dp":
        return f"{stage}dp {header.dp_rank or 0}"
    return f"{stage}tp"


def compare_ranks(ranks: Sequence[RankTrace], *, run: str, rows: int = DEFAULT_ROWS, max_listed: int = MAX_LISTED,
                  notes: Sequence[str] = (), on_point: Callable[[RankDiff], None] | None = None) -> RanksReport:
    """Compare the ranks of one run in one streaming read of every rank.

    ``on_point`` sees every differing point as it is found (one point each: ``clock == until`` when
    called; the report merges runs of them and lists only the first ``max_listed``), e.g. to mark
    every desync pass of a rank."""
    late = next((r for r in ranks if r.header.part > 0), None)
    if late is not None:  # the clock counts from a rank's first pass; a later part's start is not known
        raise TraceSetError(late.path, f"{late.label} starts at part {late.header.part}: ranks compares every "
                            "rank from its part 0")
    headers = [r.header for r in ranks]
    mode = run_mode(headers)
    groups: dict[str, list[int]] = {}
    for i, h in enumerate(headers):
        groups.setdefault(group_name(h, mode), []).append(i)
    states = [ClockState(wall_offset=h.start_wall_ns) for h in headers]
    streams: list[Iterator[Segment]] = [digest.clock_segments(r.records(), s) for r, s in zip(ranks, states)]
    timeline = None
    if mode != "tp":
        shown = [members[0] for members in groups.values()]  # one rank per DP group
        timeline = Timeline.for_ranks([ranks[i] for i in shown], rows)
        for slot, i in enumerate(shown):
            streams[i] = timeline.observe(slot, streams[i], states[i])
    labels = [r.label for r in ranks]
    facts_of_groups, diffs, runs = [], [], 0
    for name, members in groups.items():
        facts, kept, found = _compare_group(name, [labels[i] for i in members], [streams[i] for i in members],
                                            [states[i] for i in members], keep=max_listed + 1,
                                            on_point=on_point)
        facts_of_groups.append(facts)
        diffs.extend(kept)
        runs += found
    for stream in streams:  # what no comparison needed still counts (facts, the timeline)
        for _ in stream:
            pass
    diffs.sort(key=lambda d: (d.clock, d.group))
    header_diffs = header_differences(labels, headers)
    dp = None
    if timeline is not None:
        dp = timeline.report(lockstep(labels, ranks, states)
                             if mode == "dp-attention" else None)
    desync = bool(diffs or header_diffs or (dp is not None and dp.lockstep is not None and dp.lockstep.broken))
    return RanksReport(
        run=run, mode=mode, verdict="desync" if desync else "agree",
        ranks=[_rank_facts(r, group_name(r.header, mode), s) for r, s in zip(ranks, states)],
        groups=facts_of_groups, header_diffs=header_diffs, first=diffs[0] if diffs else None,
        later=diffs[1 : 1 + max_listed], later_total=max(runs - 1, 0), dp=dp,
        notes=[*notes, *_notes(ranks, states)],
    )


def _rank_facts(rank: RankTrace, group: str, state: ClockState) -> RankFacts:
    return RankFacts(rank=rank.label, group=group, files=[p.path.name for p in rank.parts],
                     pass_records=state.pass_records, clock=state.now, closed_cleanly=rank.closed_cleanly,
                     lost=state.lost, lost_at=state.lost_at)


def _notes(ranks: Sequence[RankTrace], states: Sequence[ClockState]) -> Iterator[str]:
    longest = max(s.now for s in states)
    for rank, state in zip(ranks, states):
        if state.lost_at is not None:
            yield (f"{rank.label} lost {state.lost} record(s) from pass clock {state.lost_at} on: "
                   "its later passes were not compared")
        elif state.now < longest:
            ended = "ends" if rank.closed_cleanly else "was cut off (not closed cleanly)"
            yield f"{rank.label} {ended} at pass clock {state.now}, before the longest rank ({longest})"


# --- one group in lockstep ---------------------------------------------------------------


def _compare_group(name: str, labels: list[str], streams: list[Iterator[Segment]], states: list[ClockState],
                   keep: int, on_point: Callable[[RankDiff], None] | None = None
                   ) -> tuple[GroupFacts, list[RankDiff], int]:
    """Walk the ranks' pass clocks together; spell out each point where the passes differ.

    Returns the first ``keep`` runs of one difference (memory stays bounded) and how many there were."""
    heads = [next(s, None) for s in streams]
    keys = [_key(h) for h in heads]
    clock = differing = 0
    pass_points = 0  # points where some rank had a pass (all-idle points break no run of differences)
    last_differing = -2
    diffs: list[RankDiff] = []
    latest: RankDiff | None = None  # the latest run, kept or not
    runs = 0
    while True:
        live = [i for i, h in enumerate(heads)
                if h is not None and (states[i].lost_at is None or clock < states[i].lost_at)]
        if len(live) < 2:
            break
        first = keys[live[0]]
        if first is not None or any(keys[i] is not None for i in live):
            if any(keys[i] != first for i in live[1:]):
                found = _difference(name, clock, [labels[i] for i in live], [heads[i] for i in live],
                                    [keys[i] for i in live])
                if on_point is not None:
                    on_point(msgspec.structs.replace(found))  # a copy: ``found`` may grow into a run
                differing += 1
                if latest is not None and last_differing == pass_points - 1 and _same(latest, found):
                    latest.until, latest.points = clock, latest.points + 1
                else:
                    latest, runs = found, runs + 1
                    if len(diffs) < keep:
                        diffs.append(found)
                last_differing = pass_points
            pass_points += 1
        step = min(heads[i].stop for i in live)
        for i in live:
            if heads[i].stop == step:
                heads[i] = next(streams[i], None)
                keys[i] = _key(heads[i])
        clock = step
    facts = GroupFacts(group=name, ranks=labels, compared_until=clock, differing_points=differing,
                       agree=not differing)
    return facts, diffs, runs


def _key(segment: Segment | None) -> tuple | None:
    return None if segment is None or segment.record is None else digest.content_key(segment.record)


def _same(a: RankDiff, b: RankDiff) -> bool:
    return (a.kind, a.odd, [f.field for f in a.fields]) == (b.kind, b.odd, [f.field for f in b.fields])


def _difference(group: str, clock: int, labels: list[str], heads: list[Segment], keys: list[tuple | None]) -> RankDiff:
    """Who differs at one point and how: ranks grouped by equal passes, the largest as reference."""
    classes: list[list[int]] = []
    for i, key in enumerate(keys):
        for members in classes:
            if keys[members[0]] == key:
                members.append(i)
                break
        else:
            classes.append([i])
    reference = max(classes, key=len)  # ties: the first, the class of the lowest rank
    others = [c for c in classes if c is not reference]
    ref = heads[reference[0]].record
    inputs_differ = any(
        (heads[c[0]].record is None) != (ref is None)
        or (ref is not None and digest.inputs_of(keys[c[0]]) != digest.inputs_of(keys[reference[0]]))
        for c in others
    )
    return RankDiff(
        group=group, clock=clock, until=clock, points=1, t_ns=ref.t_ns if ref is not None else None,
        kind="inputs" if inputs_differ else "decision",
        odd=sorted((labels[i] for c in others for i in c), key=labels.index),
        reference=[labels[i] for i in reference],
        passes={labels[i]: (h.record.seq if h.record is not None else None) for i, h in enumerate(heads)},
        fields=_field_diffs(labels, [reference, *others], [heads[c[0]].record for c in [reference, *others]]),
    )


def _field_diffs(labels: list[str], classes: list[list[int]], records: list[Any]) -> list[FieldDiff]:
    """Each differing field once, with the value of every class of ranks (equal values merged)."""
    ref = records[0]
    if any((r is None) != (ref is None) for r in records[1:]):
        idle = [ValueGroup(ranks=[labels[i] for i in c], value=r is None) for c, r in zip(classes, records)]
        return [FieldDiff(field="idle", side="input", values=merged(idle))]
    paths: dict[tuple, str] = {}
    for other in records[1:]:
        inputs, outputs = digest.pass_diff_paths(ref, other)
        paths.update({p: "input" for p in inputs if p not in paths})
        paths.update({p: "output" for p in outputs if p not in paths})
    return [
        FieldDiff(field=digest.path_text(path), side=side, values=merged([
            ValueGroup(ranks=[labels[i] for i in c], value=digest.shown_value(digest.pass_value(r, path)))
            for c, r in zip(classes, records)
        ]))
        for path, side in paths.items()
    ]


def header_differences(labels: list[str], headers: list[Header]) -> list[FieldDiff]:
    """Shared header fields (server args, pools, versions, sizes) that are not the same on every rank."""
    paths: list[tuple] = []
    for h in headers[1:]:
        for name in SHARED_FIELDS:
            found = digest.diff_paths(getattr(headers[0], name), getattr(h, name), (name,))
            paths.extend(p for p in found if p not in paths)
    return [
        FieldDiff(field=digest.path_text(path), side="header", values=merged([
            ValueGroup(ranks=[label], value=digest.shown_value(digest.value_at(h, path)))
            for label, h in zip(labels, headers)
        ]))
        for path in paths[: digest.MAX_PATHS]
    ]


# --- DP ranks side by side ---------------------------------------------------------------


@dataclass(slots=True)
class _Cell:
    passes: int = 0
    idle: int = 0
    waiting: int = 0  # summed over recorded passes (repeats counted)
    waiting_max: int = 0
    running: int = 0
    admitted: int = 0
    tokens: int = 0


class Timeline:
    """DP ranks side by side on the wall clock (start time + t_ns, corrected by clock records)."""

    def __init__(self, labels: list[str], start_wall_ns: int, bucket_ns: int, rows: int) -> None:
        self.labels, self.start, self.bucket_ns = labels, start_wall_ns, bucket_ns
        self.max_rows = rows * ROW_SLACK  # rows come from the headers' span; clock records can move passes later
        self.cells: list[list[_Cell]] = [[] for _ in labels]

    @classmethod
    def for_ranks(cls, ranks: Sequence[RankTrace], rows: int) -> Timeline:
        start = min(r.header.start_wall_ns for r in ranks)
        ends = [r.header.start_wall_ns + r.pass_at(r.pass_count - 1).t_ns for r in ranks if r.pass_count]
        span = max([*ends, start]) - start + 1
        return cls([r.label for r in ranks], start, _round_up(-(-span // max(rows, 1))), max(rows, 1))

    def observe(self, slot: int, stream: Iterator[Segment], state: ClockState) -> Iterator[Segment]:
        """``stream`` unchanged, each segment counted into its row."""
        cells, last = self.cells[slot], self.max_rows - 1
        for seg in stream:
            row = min(max((state.wall_offset + seg.t_ns - self.start) // self.bucket_ns, 0), last)
            while len(cells) <= row:
                cells.append(_Cell())
            cell, n = cells[row], seg.stop - seg.start
            cell.passes += n
            p = seg.record
            if p is None:
                cell.idle += n
            else:
                cell.waiting += len(p.waiting) * n
                cell.waiting_max = max(cell.waiting_max, len(p.waiting))
                cell.running += len(p.running) * n
                cell.admitted += len(p.admitted)
                cell.tokens += sum(a.extend_len for a in p.admitted)
            yield seg

    def report(self, lock: Lockstep | None) -> DpReport:
        rows = [self._row(i) for i in range(max(len(c) for c in self.cells))]
        return DpReport(ranks=self.labels, bucket_ns=self.bucket_ns, rows=rows, lockstep=lock,
                        not_in_trace=list(NOT_IN_TRACE))

    def _row(self, i: int) -> DpRow:
        cells = []
        for label, column in zip(self.labels, self.cells):
            c = column[i] if i < len(column) else _Cell()
            busy = c.passes - c.idle
            cells.append(DpCell(rank=label, passes=c.passes, idle=c.idle,
                                waiting_mean=round(c.waiting / busy, 2) if busy else 0.0,
                                waiting_max=c.waiting_max, running_mean=round(c.running / busy, 2) if busy else 0.0,
                                admitted=c.admitted, admitted_tokens=c.tokens))
        return DpRow(t_ns=i * self.bucket_ns, cells=cells,
                     idle_ranks=[c.rank for c in cells if c.passes and c.idle == c.passes],
                     running_imbalance=_imbalance([c.running_mean for c in cells]),
                     waiting_imbalance=_imbalance([c.waiting_mean for c in cells]))


def lockstep(labels: list[str], ranks: Sequence[RankTrace], states: Sequence[ClockState]) -> Lockstep:
    clocks = {label: s.now for label, s in zip(labels, states)}
    exact = all(r.closed_cleanly for r in ranks) and not any(s.lost for s in states)
    skew = max(clocks.values()) - min(clocks.values())
    return Lockstep(clocks=clocks, exact=exact, skew=skew, broken=exact and skew > LOCKSTEP_SLACK)


def _imbalance(values: list[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return round(max(values) / mean, 2) if mean else 1.0


def _round_up(ns: int) -> int:
    """The next 1, 2 or 5 times a power of ten: row widths a reader takes in at a glance."""
    unit = 1
    while True:
        for step in (1, 2, 5):
            if unit * step >= ns:
                return unit * step
        unit *= 10
