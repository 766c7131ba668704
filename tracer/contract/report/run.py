"""The replay report: what ``schedtrace replay --json`` writes and the TUI reads.

docs/replay-report.md documents every key. The JSON is deterministic: the
same trace and arms give the same bytes (sorted lists, no wall-clock times,
no host names).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

import msgspec

from schedtrace.tracer.contract.errors import TraceFormatError, TraceNotFoundError, TraceVersionError

REPORT_VERSION: Final = 2  # 2: ``holes`` (version 1 reports still load: it defaults to none)
MAX_REPORT_BYTES: Final = 64 << 20  # a report is read whole; past this it is refused, not parsed

# Divergence kinds, in the order they are listed.
# How two arms' decisions on one pass can differ (Divergence.kinds), each named once:
KIND_ADMITTED: Final = "admitted"  # admitted rids or their extend lengths differ
KIND_CHUNK: Final = "chunk"  # continuing chunk size, or run vs deferred
KIND_BATCH_IS_FULL: Final = "batch_is_full"
KIND_NEW_CHUNKED: Final = "new_chunked"  # the new chunked request differs
KIND_AITER: Final = "aiter"  # aiter attention method differs
KIND_OVER_ASK: Final = "over_ask"  # one arm asks alloc_extend for more than free + evictable
KIND_ERROR: Final = "error"  # one arm raised (e.g. the one-chunk assert)
DIVERGENCE_KINDS: Final = (KIND_ADMITTED, KIND_CHUNK, KIND_BATCH_IS_FULL, KIND_NEW_CHUNKED, KIND_AITER,
                           KIND_OVER_ASK, KIND_ERROR)


class Decision(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The decision fields of one pass under one arm (same as the recorder's outputs)."""

    admitted: list[tuple[str, int]]  # (rid, extend_len) in admission order
    chunk_budget: int | None = None  # available_chunk_tokens result for the continuing chunk
    chunk_size: int | None = None  # continuing chunk's extend (None: not run / deferred)
    new_chunked_rid: str | None = None
    batch_is_full: bool = False
    aiter_method: str | None = None
    over_ask: int = 0  # tokens asked beyond free + evictable (0: fits)
    error: str | None = None  # "Type: message" if the arm raised
    # The order calc_priority left the queue in, as Pass.order's runs (None: the entry order).
    queue_order: list[int] | None = None
    released: list[str] | None = None  # running requests priority preemption released, in order


class Divergence(msgspec.Struct, kw_only=True, rename={"pass_": "pass"}):
    pass_: int  # pass number (Pass.seq)
    t_ns: int
    kinds: list[str]  # subset of DIVERGENCE_KINDS, in that order
    fixes: list[str]  # fixes that, applied alone, reproduce the new arm's decision
    old: Decision
    new: Decision


class Mismatch(msgspec.Struct, kw_only=True, rename={"pass_": "pass"}):
    """A pass where the replayed arm disagrees with the recorded decision."""

    pass_: int
    fields: list[str]
    recorded: Decision
    replayed: Decision


class Fidelity(msgspec.Struct, kw_only=True):
    arm: str  # the arm compared with the recording (the old arm)
    matched: int
    total: int
    mismatches: list[Mismatch] = []
    # calc_priority's order against Pass.order, on the passes of a trace that records it
    # (order_total 0: an older trace, whose cache-aware orders are not checked).
    order_matched: int = 0
    order_total: int = 0


class Stall(msgspec.Struct, kw_only=True):
    start_pass: int  # onset: first pass of the run
    end_pass: int  # last pass of the run
    passes: int
    head_rid: str | None  # request at the head of the queue at onset


class ArmError(msgspec.Struct, kw_only=True, rename={"pass_": "pass"}):
    pass_: int
    error: str


class ArmOutcome(msgspec.Struct, kw_only=True):
    """Closed-loop result of one arm."""

    stalls: int
    stalled_passes: int
    over_asks: int
    exceptions: int
    completed: int
    queue_peak: int
    first_admission_passes: dict[str, int]  # rid -> passes from arrival to first admission
    # Appended by closed_loop (defaults keep older reports readable):
    passes: int = 0  # closed-loop passes this arm ran
    stall_runs: list[Stall] = []  # the stalls counted above, in closed-loop pass numbers
    errors: list[ArmError] = []  # the first exceptions (``exceptions`` counts them all)
    retractions: int = 0  # requests retracted for decode KV
    truncated_prefills: int = 0  # untracked unfinished chunks run on part of their prompt
    unfinished: int = 0  # requests still waiting, running or to arrive when the loop stopped
    stuck_at: int | None = None  # pass after which the state could never change again


class SelfCheck(msgspec.Struct, kw_only=True):
    """The stock arm's closed loop against the recording (docs/closed-loop.md, "Self-check").

    Waits are in scheduler passes on both sides (the recorded pass clock);
    quantiles are nearest-rank.
    """

    arm: str  # the arm compared with the recording (stock)
    requests: int  # admitted in both: the waits compared
    wait_error_p50: float  # median over them of |loop - recorded| / max(recorded, 1)
    wait_error_p90: float
    recorded_wait_p50: int  # first-admission wait in passes, over the same requests
    loop_wait_p50: int
    recorded_wait_p90: int
    loop_wait_p90: int
    recorded_queue_peak: int  # longest waiting queue at a pass entry, from the start pass on
    loop_queue_peak: int
    finished: int  # requests finished in both: the completion order compared
    order_agreement: float  # of their pairs in a strict order on both sides, the fraction in the same order
    kendall_tau: float  # tau-b of the two completion orders (ties counted)
    recorded_only: int = 0  # admitted in the recording, never in the loop
    loop_only: int = 0  # admitted in the loop, never in the recording


class ClosedLoop(msgspec.Struct, kw_only=True):
    from_pass: int
    passes: int
    arms: dict[str, ArmOutcome]
    self_check: SelfCheck | None = None  # with a stock arm: how closely it reproduces the recording
    # Where a fresh request's prefix match came from: PREFIX_MATCHES_TREE, each arm's own radix tree of
    # prefix ids (docs/closed-loop.md), or PREFIX_MATCHES_RECORDED, the recording's (no ids, a hybrid
    # pool, no radix cache); None in reports written before it was reported.
    prefix_matches: str | None = None


PREFIX_MATCHES_TREE: Final = "arm-tree"
PREFIX_MATCHES_RECORDED: Final = "recorded"


# Regions and loss records a report lists (every one is counted): a report stays bounded.
MAX_HOLES_LISTED: Final = 256


class DamagedRegion(msgspec.Struct, kw_only=True):
    """Bytes that could not be read (``TraceReader.gaps``), and the pass numbers lost with them."""

    start: int  # first unreadable byte (a rank's parts: offsets global over them)
    end: int  # first byte after it
    records_lost: int | None  # records that were in it (None: unknown)
    first_pass: int | None  # first pass number missing with it (None: it held no pass)
    last_pass: int | None  # last one, v2 delta passes after it up to the next keyframe included
    passes_lost: int
    reason: str  # what was wrong where reading stopped


class LostRecords(msgspec.Struct, kw_only=True):
    """A ``loss`` record: records the recorder counted but never wrote."""

    offset: int  # where the loss record is
    reason: str  # queue_full, write_error, ring, paused
    count: int
    after_pass: int | None  # the last pass number before it in the file (None: none before it)


class Holes(msgspec.Struct, kw_only=True):
    """What a trace is missing: unreadable regions and loss records, counted, the first listed."""

    regions: list[DamagedRegion] = []  # the first MAX_HOLES_LISTED, in file order
    losses: list[LostRecords] = []  # the first MAX_HOLES_LISTED, in file order
    region_count: int = 0
    loss_count: int = 0  # loss records
    records_lost: int = 0  # in regions of known count, and counted by every loss record
    unknown_regions: int = 0  # regions whose record count is unknown (records_lost is then a floor)
    passes_lost: int = 0  # pass numbers not in the trace's readable data

    @property
    def count(self) -> int:
        return self.region_count + self.loss_count


class Report(msgspec.Struct, kw_only=True):
    version: int = REPORT_VERSION
    trace: str
    sglang_version: str  # installed sglang that replayed
    trace_sglang_version: str  # sglang that recorded
    old: str
    new: str
    passes: int
    truncated_at: int | None = None
    unknown_records: dict[str, int] = {}
    fidelity: Fidelity
    divergences: list[Divergence]
    stalls: dict[str, list[Stall]]  # arm name -> stalls (open-loop)
    errors: dict[str, list[ArmError]]  # arm name -> exceptions raised
    closed_loop: ClosedLoop | None = None
    # Appended by the open-loop engine (defaults keep older reports readable):
    aiter_events: int = 0  # aiter records replayed (also counted in fidelity.total)
    warnings: list[str] = []  # version mismatch, torn tail: why the result may be partial
    # Hybrid (SWA/mamba) traces: fix name -> how it meets these pools ("applies: ...",
    # "already present: ...", "not reached: ..."); empty for a full-pool trace.
    fix_notes: dict[str, str] = {}
    # TraceReader.fingerprint() of the trace replayed; "" in older reports.
    trace_fingerprint: str = ""
    # Unreadable regions and loss records; fidelity, divergences and stalls are over the passes present.
    holes: Holes = msgspec.field(default_factory=Holes)
    # Tasks a distributed backend (--ray) ran again after their worker died; 0 locally.
    retried_tasks: int = 0
    # Not replayed: the rank of its TP group whose replay this is (replay/rank_groups.py), and why that holds.
    same_as: str | None = None
    same_as_why: str = ""


SWEEP_VERSION: Final = 1


class SweepArm(msgspec.Struct, kw_only=True):
    """One arm's closed loop in one sweep cell (docs/sweep.md); waits in passes, nearest-rank."""

    stalls: int
    stalled_passes: int
    queue_peak: int
    wait_p50: int  # first-admission wait, over the requests admitted
    wait_p90: int
    over_asks: int
    exceptions: int  # passes where the real code raised (the one-chunk assert, ...)
    retractions: int
    completed: int
    unfinished: int
    passes: int  # steps until the arm was done (or stopped)
    stuck_at: int | None = None


class SweepCell(msgspec.Struct, kw_only=True):
    config: dict[str, int | str]  # the swept keys' values in this cell
    arms: dict[str, SweepArm]


class SweepReport(msgspec.Struct, kw_only=True):
    """``schedtrace sweep --json``: the closed loop of every arm in every cell of a grid."""

    version: int = SWEEP_VERSION
    trace: str
    sglang_version: str
    from_pass: int
    stall_passes: int
    arms: list[str]
    grid: dict[str, list[int | str]]  # key -> values swept (the table's order: ``keys``)
    keys: list[str]  # the swept keys in the order given
    recorded: dict[str, int | str]  # what the trace's server ran with, for the same keys
    cells: list[SweepCell]  # every combination, the first key varying slowest
    self_check: SelfCheck | None = None  # stock under the recorded config against the recording
    notes: list[str] = []  # what a what-if can and cannot tell
    retried_tasks: int = 0  # cells a distributed backend (--ray) ran again after their worker died


_json_encoder = msgspec.json.Encoder(order="sorted")
_json_decoder = msgspec.json.Decoder(Report)


def dump_report(report: Report) -> bytes:
    """Deterministic JSON bytes (sorted keys, trailing newline)."""
    return msgspec.json.format(_json_encoder.encode(report), indent=2) + b"\n"


def dump_sweep(report: SweepReport) -> bytes:
    """Deterministic JSON bytes (sorted keys, trailing newline)."""
    return msgspec.json.format(_json_encoder.encode(report), indent=2) + b"\n"


class _Versioned(msgspec.Struct):
    version: int = REPORT_VERSION


_version_decoder = msgspec.json.Decoder(_Versioned)


def load_report(path: str | Path, *, max_bytes: int = MAX_REPORT_BYTES) -> Report:
    """Read a replay report: a regular file of at most ``max_bytes``, of a version this reader knows.

    Whether its pass numbers fit a trace is ``report_check.check_report``'s job (it needs the trace).
    """
    name = str(path)
    try:
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise TraceNotFoundError(name, "not a regular file, expected a replay report (JSON)")
            # The size is checked before reading and again after: the file may grow meanwhile.
            data = file.read(max_bytes + 1) if info.st_size <= max_bytes else b""
    except FileNotFoundError:
        raise TraceNotFoundError(name, "no such replay report") from None
    except IsADirectoryError:
        raise TraceNotFoundError(name, "is a directory, expected a replay report (JSON)") from None
    except OSError as exc:
        raise TraceNotFoundError(name, f"cannot read the replay report: {exc.strerror or exc}") from None
    if len(data) > max_bytes or info.st_size > max_bytes:
        raise TraceFormatError(name, 0, f"replay report is over the {max_bytes:,}-byte limit "
                               f"({max(info.st_size, len(data)):,} bytes)")
    try:
        version = _version_decoder.decode(data).version
        if version > REPORT_VERSION:
            raise TraceVersionError(name, f"replay report version {version} is newer than this reader "
                                    f"({REPORT_VERSION})")
        if version < 1:
            raise TraceFormatError(name, 0, f"replay report version {version} is not a version")
        return _json_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(name, 0, f"not a schedtrace replay report: {exc}") from None
