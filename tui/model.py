"""Pure view-model code for the TUI: no Textual, no terminal.

Everything the screens show is computed here from a ``TraceReader`` and an
optional replay ``Report``, so it can be tested (and benchmarked) without an
app. Big per-pass data lives in compact ``array``s, never in lists of objects.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from schedtrace.tracer.analysis.decision import recorded_decision  # noqa: F401 - the one Pass -> Decision mapping (re-exported)
from schedtrace.tracer.contract.report import Decision, Divergence, Report
from schedtrace.tracer.contract.names import DEFAULT_STALL_PASSES
from schedtrace.tracer.analysis.stalls import StallScanner
from schedtrace.tracer.analysis.outcome import OUTCOMES, pass_outcome
from schedtrace.tracer.contract.format import TraceReader
from schedtrace.tracer.contract.schema import Abort, Alloc, Arrival, Finish, Header, Loss, Pass, Retract

# --- per-pass summaries ---------------------------------------------------------

RESULTS: Final = OUTCOMES
_RESULT_CODE: Final = {name: code for code, name in enumerate(RESULTS)}
pass_result = pass_outcome


@dataclass(frozen=True)
class FieldDiff:
    name: str
    old: str
    new: str

    @property
    def differs(self) -> bool:
        return self.old != self.new


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(f"{rid}+{n}" if isinstance(rid, str) else str(rid) for rid, n in value) or "(none)"
    return str(value)


def decision_diff(old: Decision, new: Decision) -> list[FieldDiff]:
    """Every decision field, old next to new, as display text."""
    return [
        FieldDiff(name, _show(getattr(old, name)), _show(getattr(new, name)))
        for name in old.__struct_fields__
    ]


def humanize_ns(ns: int) -> str:
    seconds = ns / 1e9
    if seconds < 1:
        return f"{ns / 1e6:.1f}ms"
    if seconds < 120:
        return f"{seconds:.2f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


@dataclass(frozen=True)
class PassRow:
    """The columns of one pass-list line."""

    seq: int
    time: str
    waiting: int
    running: int
    kv: str
    admitted: str
    result: str


PASS_HEADER: Final = PassRow(seq=-1, time="time", waiting=0, running=0, kv="free/evict", admitted="admitted",
                             result="result")


def pass_row(p: Pass) -> PassRow:
    admitted = sum(a.extend_len for a in p.admitted)
    what = f"{len(p.admitted)} ({admitted} tok)" if p.admitted else ""
    if p.chunk is not None and p.chunk.size:
        what = (what + " " if what else "") + f"chunk {p.chunk.size}"
    return PassRow(
        seq=p.seq,
        time=humanize_ns(p.t_ns),
        waiting=len(p.waiting),
        running=len(p.running),
        kv=f"{p.kv.available}/{p.kv.evictable}",
        admitted=what,
        result=pass_result(p),
    )


class PassCache:
    """Decoded passes by number, at most ``size`` kept (the visible rows and a few more)."""

    def __init__(self, reader: TraceReader, size: int = 512) -> None:
        self.reader = reader
        self.size = size
        self._cache: OrderedDict[int, Pass] = OrderedDict()

    def get(self, n: int) -> Pass:
        cache = self._cache
        hit = cache.get(n)
        if hit is not None:
            cache.move_to_end(n)
            return hit
        p = self.reader.pass_at(n)
        cache[n] = p
        if len(cache) > self.size:
            cache.popitem(last=False)
        return p

    def __len__(self) -> int:
        return len(self._cache)


# --- trace summary ----------------------------------------------------------------


def header_lines(header: Header, *, pass_count: int, duration_ns: int | None, losses: int,
                 truncated_at: int | None, closed_cleanly: bool) -> list[tuple[str, str]]:
    """(label, value) pairs for the header bar."""
    args = header.server_args
    rank = f"tp{header.tp_rank}" + (f" dp{header.dp_rank}" if header.dp_rank is not None else "")
    pairs = [
        ("model", args.model_path),
        ("sglang", header.sglang_version),
        ("rank", rank),
        ("policy", args.schedule_policy),
        ("chunk", str(args.chunked_prefill_size)),
        ("max running", str(args.max_running_requests)),
        ("max tokens", str(args.max_total_tokens)),
        ("duration", humanize_ns(duration_ns) if duration_ns is not None else "…"),
        ("passes", f"{pass_count:,}"),
        ("lost", str(losses)),
    ]
    if truncated_at is not None:
        pairs.append(("TRUNCATED", f"at byte {truncated_at:,}"))
    elif not closed_cleanly:
        pairs.append(("unclosed", "no footer"))
    if header.part:
        pairs.append(("part", str(header.part)))
    return pairs


# --- one scan over the whole trace --------------------------------------------------

SERIES: Final = ("waiting", "running", "kv_free", "kv_evictable", "chunk")


@dataclass(slots=True)
class RidSpan:
    first_pass: int
    last_pass: int
    arrival_ns: int | None = None
    finish: str | None = None  # "length @ 1.2s", "abort @ ...", None while unfinished


_NONE: Final = -(2**63)  # "no value" in the int64 columns below


class RidIndex:
    """Every rid's pass span, arrival and finish, in columns (a million requests fit in ~100 MB).

    One ``RidSpan`` object per rid costs about three times as much; spans are
    made on demand by ``get``.
    """

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.first_pass = array("q")
        self.last_pass = array("q")
        self.arrival_ns = array("q")
        self.finish_ns = array("q")
        self.finish_reason = array("H")  # index into self._reasons
        self._reasons: list[str] = []
        self._reason_code: dict[str, int] = {}

    def touch(self, rid: str, n: int) -> None:
        """``rid`` is seen at pass ``n``."""
        i = self._index.get(rid)
        if i is None:
            self._add(rid, n)
        elif n > self.last_pass[i]:
            self.last_pass[i] = n

    def _add(self, rid: str, n: int) -> int:
        i = self._index[rid] = len(self.first_pass)
        self.first_pass.append(n)
        self.last_pass.append(n)
        self.arrival_ns.append(_NONE)
        self.finish_ns.append(_NONE)
        self.finish_reason.append(0)
        return i

    def arrived(self, rid: str, n: int, t_ns: int) -> None:
        i = self._index.get(rid)
        if i is None:
            i = self._add(rid, n)
        self.arrival_ns[i] = t_ns

    def finished(self, rid: str, last_pass: int, reason: str, t_ns: int) -> None:
        """A known rid ended (unknown rids are ignored, as before they were ever seen)."""
        i = self._index.get(rid)
        if i is None:
            return
        self.last_pass[i] = max(self.last_pass[i], last_pass)
        code = self._reason_code.get(reason)
        if code is None:
            code = self._reason_code[reason] = len(self._reasons)
            self._reasons.append(reason)
        self.finish_reason[i] = code
        self.finish_ns[i] = t_ns

    def get(self, rid: str) -> RidSpan | None:
        i = self._index.get(rid)
        if i is None:
            return None
        arrival, finish_ns = self.arrival_ns[i], self.finish_ns[i]
        finish = None if finish_ns == _NONE else f"{self._reasons[self.finish_reason[i]]} @ {humanize_ns(finish_ns)}"
        return RidSpan(self.first_pass[i], self.last_pass[i], None if arrival == _NONE else arrival, finish)

    def __getitem__(self, rid: str) -> RidSpan:
        span = self.get(rid)
        if span is None:
            raise KeyError(rid)
        return span

    def __contains__(self, rid: object) -> bool:
        return rid in self._index

    def __len__(self) -> int:
        return len(self._index)


@dataclass
class ScanResult:
    """What one pass over every record yields; arrays are indexed by pass number."""

    series: dict[str, array] = field(default_factory=lambda: {name: array("q") for name in SERIES})
    t_ns: array = field(default_factory=lambda: array("q"))
    results: array = field(default_factory=lambda: array("B"))  # codes into RESULTS
    error_passes: array = field(default_factory=lambda: array("q"))  # raised, or a failed alloc
    failed_allocs: array = field(default_factory=lambda: array("q"))
    rids: RidIndex = field(default_factory=RidIndex)
    stalls: list[tuple[int, int]] = field(default_factory=list)  # recorded stalls (schedtrace.tracer.analysis.stalls rules)
    losses: int = 0
    end_ns: int = 0
    truncated_at: int | None = None
    failure: str | None = None  # the format error that ended the scan early

    @property
    def passes(self) -> int:
        return len(self.t_ns)


def scan_trace(reader: TraceReader, *, on_progress: Callable[[int, int], None] | None = None,
               cancelled: Callable[[], bool] = lambda: False, every: int = 20_000) -> ScanResult:
    """Read every record once: the timeline series, error passes and rid spans.

    ``reader`` must not be used by another thread meanwhile (it seeks its
    file); give the scan its own reader. A format error ends the scan early
    with what was read so far and the error in ``failure``.
    """
    from schedtrace.tracer.contract.errors import TraceFormatError

    out = ScanResult()
    stall_scanner = StallScanner(DEFAULT_STALL_PASSES, reader.header.server_args.max_running_requests)
    s = out.series
    waiting, running, kv_free, kv_evict, chunk = (s[name] for name in SERIES)
    rids = out.rids
    touch = rids.touch
    pending_arrivals: list[tuple[str, int]] = []
    last_pass = -1
    end_ns = 0
    size = max(reader.data_end, 1)
    try:
        for offset, record in reader.records():
            kind = type(record)
            if kind is Pass:
                last_pass = n = len(out.t_ns)
                out.t_ns.append(record.t_ns)
                waiting.append(len(record.waiting))
                running.append(len(record.running))
                kv_free.append(record.kv.available)
                kv_evict.append(record.kv.evictable)
                chunk.append((record.chunk.size or 0) if record.chunk else 0)
                out.results.append(_RESULT_CODE[pass_result(record)])
                if record.error:
                    out.error_passes.append(n)
                stall_scanner.feed_pass(record, recorded_decision(record), seq=n)
                for rid, at in pending_arrivals:
                    rids.arrived(rid, n, at)
                pending_arrivals.clear()
                for c in record.candidates:
                    touch(c.rid, n)
                for a in record.admitted:
                    touch(a.rid, n)
                if record.chunked is not None:
                    touch(record.chunked.rid, n)
                if n % every == 0:
                    # Drop the mapped pages already read, so a big scan does not count the
                    # whole file in our RSS.
                    reader.release_pages(offset)
                    if on_progress is not None:
                        on_progress(offset, size)
                    if cancelled():
                        break
            elif kind is Arrival:
                pending_arrivals.append((record.rid, record.t_ns))
            elif kind is Finish or kind is Abort:
                rids.finished(record.rid, last_pass, record.reason if kind is Finish else "abort", record.t_ns)
            elif kind is Retract:
                touch(record.rid, max(last_pass, 0))
            elif kind is Alloc:
                if not record.ok:
                    out.failed_allocs.append(record.pass_seq)
                    out.error_passes.append(record.pass_seq)
            elif kind is Loss:
                out.losses += record.count
            end_ns = max(end_ns, getattr(record, "t_ns", 0))
    except TraceFormatError as exc:
        out.failure = str(exc)
    out.end_ns = end_ns
    out.truncated_at = reader.truncated_at
    out.stalls = [(st.start_pass, st.end_pass) for st in stall_scanner.finish()]
    # Sorted and unique, so bisect can walk them.
    out.error_passes = array("q", sorted(set(p for p in out.error_passes if p >= 0)))
    return out


# --- marks and navigation -------------------------------------------------------------

class Marks:
    """Sorted pass numbers of each kind of event, for next/previous jumps."""

    KINDS: Final = ("divergence", "stall", "error")

    def __init__(self) -> None:
        self.divergence = array("q")
        self.stall = array("q")  # stall onsets
        self.stall_ranges: list[tuple[int, int]] = []
        self.error = array("q")

    def of(self, kind: str) -> array:
        return getattr(self, kind)

    def next(self, kind: str, current: int) -> int | None:
        points = self.of(kind)
        i = bisect_right(points, current)
        return points[i] if i < len(points) else None

    def previous(self, kind: str, current: int) -> int | None:
        points = self.of(kind)
        i = bisect_left(points, current)
        return points[i - 1] if i > 0 else None

    def set_stalls(self, ranges: Iterable[tuple[int, int]]) -> None:
        self.stall_ranges = sorted(set(ranges))
        self.stall = array("q", sorted({start for start, _ in self.stall_ranges}))

    def in_stall(self, n: int) -> bool:
        i = bisect_right(self.stall, n)
        return any(start <= n <= end for start, end in self.stall_ranges[max(0, i - 4):i])


class ReplayIndex:
    """The report's divergences, errors and fidelity mismatches by pass number."""

    def __init__(self, report: Report | None = None) -> None:
        self.report = report
        self.divergences: dict[int, Divergence] = {}
        self.fixes: set[str] = set()
        self._mismatches: dict[int, object] | None = None
        if report is not None:
            for d in report.divergences:
                self.add(d)

    def add(self, divergence: Divergence) -> None:
        self.divergences[divergence.pass_] = divergence
        self.fixes.update(divergence.fixes)

    def mismatch_at(self, n: int):
        if self.report is None:
            return None
        if self._mismatches is None:  # first one per pass, as a linear search would find
            self._mismatches = {}
            for m in self.report.fidelity.mismatches:
                self._mismatches.setdefault(m.pass_, m)
        return self._mismatches.get(n)

    def stall_ranges(self) -> list[tuple[int, int]]:
        if self.report is None:
            return []
        return [(s.start_pass, s.end_pass) for stalls in self.report.stalls.values() for s in stalls]

    def error_passes(self) -> list[int]:
        if self.report is None:
            return []
        return [e.pass_ for errors in self.report.errors.values() for e in errors]


def build_marks(scan: ScanResult | None, replay: ReplayIndex) -> Marks:
    marks = Marks()
    marks.divergence = array("q", sorted(replay.divergences))
    ranges = replay.stall_ranges()
    if not ranges and scan is not None and replay.report is None:
        ranges = scan.stalls
    marks.set_stalls(ranges)
    errors = set(replay.error_passes())
    if scan is not None:
        errors.update(scan.error_passes)
    marks.error = array("q", sorted(errors))
    return marks


# --- filters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PassFilter:
    """``kind`` is "divergent", "fix" (with ``value`` a fix name) or "result" (a RESULTS word)."""

    kind: str
    value: str = ""
    inverse: bool = False

    def describe(self) -> str:
        what = {"divergent": "divergent", "fix": f"fix={self.value}", "result": f"result={self.value}"}[self.kind]
        return ("not " if self.inverse else "") + what

    @classmethod
    def parse(cls, text: str) -> PassFilter:
        """``divergent``, ``fix NAME``, ``result WORD``; a leading ``!`` or ``not`` inverts."""
        text = text.strip()
        inverse = False
        if text.startswith("!"):
            inverse, text = True, text[1:].strip()
        elif text.startswith("not "):
            inverse, text = True, text[4:].strip()
        word, _, value = text.partition(" ")
        word, value = word.strip().lower(), value.strip()
        if word in ("divergent", "div", "d"):
            return cls("divergent", inverse=inverse)
        if word in ("fix", "f") and value:
            return cls("fix", value, inverse)
        if word in ("result", "r") and value in RESULTS:
            return cls("result", value, inverse)
        raise ValueError(
            f"unknown filter {text!r}: use 'divergent', 'fix NAME' or 'result {'|'.join(RESULTS)}', "
            "with '!' in front to invert"
        )


def apply_filter(flt: PassFilter, passes: int, replay: ReplayIndex, results: Sequence[int] | None) -> array:
    """Pass numbers that match ``flt``, ascending."""
    if flt.kind == "divergent":
        chosen = set(replay.divergences)
    elif flt.kind == "fix":
        chosen = {n for n, d in replay.divergences.items() if flt.value in d.fixes}
    else:
        if results is None:
            raise ValueError("result filters need the trace scan to finish first")
        code = _RESULT_CODE[flt.value]
        return array("q", (n for n in range(min(passes, len(results))) if (results[n] == code) != flt.inverse))
    if flt.inverse:
        return array("q", (n for n in range(passes) if n not in chosen))
    return array("q", sorted(n for n in chosen if n < passes))


# --- request view -----------------------------------------------------------------------


@dataclass(frozen=True)
class LifeStep:
    first: int  # pass range this state held over
    last: int
    state: str  # "waiting", "admitted", "chunk", "running", "arrived", "finished", ...
    detail: str

    def passes_text(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}–{self.last}"


def _why_waiting(p: Pass, rid: str, position: int, max_running: int | None) -> str:
    for c in p.candidates:
        if c.rid == rid:
            if c.result == "NO_TOKEN":
                return f"tried: NO_TOKEN (free {p.kv.available} + evictable {p.kv.evictable} too small)"
            return f"tried: {c.result}"
    if p.error:
        return f"pass raised: {p.error}"
    if p.batch_is_full_in:
        return "not tried: batch_is_full was latched"
    rejected = next((c for c in p.candidates if c.result != "CONTINUE"), None)
    if rejected is not None:
        return f"not tried: {rejected.rid} ahead of it got {rejected.result}"
    if max_running is not None and len(p.running) >= max_running:
        return f"not tried: running batch full ({len(p.running)}/{max_running})"
    if p.req_slots_free <= 0:
        return "not tried: no free request slot"
    if p.admitted:
        return f"not reached: prefill budget used by {len(p.admitted)} admitted (queue position {position + 1})"
    if p.chunk is not None and p.chunk.size:
        return f"not reached: prefill budget used by the continuing chunk of {p.chunk.rid}"
    return f"not reached (queue position {position + 1})"


def request_life(rid: str, passes: Iterable[Pass], span: RidSpan | None = None,
                 max_running: int | None = None) -> list[LifeStep]:
    """The life of one request over ``passes`` (ascending), consecutive equal states folded."""
    steps: list[LifeStep] = []
    if span is not None and span.arrival_ns is not None:
        steps.append(LifeStep(span.first_pass, span.first_pass, "arrived", f"at {humanize_ns(span.arrival_ns)}"))

    def push(n: int, state: str, detail: str) -> None:
        if steps and steps[-1].state == state and steps[-1].detail == detail and steps[-1].last == n - 1:
            last = steps[-1]
            steps[-1] = LifeStep(last.first, n, state, detail)
        else:
            steps.append(LifeStep(n, n, state, detail))

    for p in passes:
        n = p.seq
        admitted = next((a for a in p.admitted if a.rid == rid), None)
        if admitted is not None:
            chunked = " (chunked: more to come)" if p.new_chunked_rid == rid else ""
            push(n, "admitted", f"prefix {admitted.prefix_len}, extend {admitted.extend_len}{chunked}")
            continue
        if p.chunked is not None and p.chunked.rid == rid:
            c = p.chunk
            if c is None or c.size is None:
                budget = "-" if c is None else c.budget
                push(n, "chunk", f"continuing chunk deferred (budget {budget}, {p.chunked.prefix_len}/"
                                 f"{p.chunked.input_len} done)")
            else:
                push(n, "chunk", f"chunk of {c.size} (budget {c.budget}, {p.chunked.prefix_len}/"
                                 f"{p.chunked.input_len} done)")
            continue
        position = next((i for i, w in enumerate(p.waiting) if w.rid == rid), -1)
        if position >= 0:
            push(n, "waiting", _why_waiting(p, rid, position, max_running))
            continue
        if any(r.rid == rid for r in p.running):
            push(n, "running", "decoding")
    if span is not None and span.finish is not None:
        steps.append(LifeStep(span.last_pass, span.last_pass, "finished", span.finish))
    return steps


def find_rid_passes(reader: TraceReader, rid: str, start: int, stop: int) -> Iterable[Pass]:
    """Passes in [start, stop] that mention ``rid`` anywhere."""
    for p in reader.passes(start, stop + 1):
        if (
            any(w.rid == rid for w in p.waiting)
            or any(r.rid == rid for r in p.running)
            or (p.chunked is not None and p.chunked.rid == rid)
            or any(a.rid == rid for a in p.admitted)
        ):
            yield p


# --- timeline ---------------------------------------------------------------------------


def downsample(values: Sequence[int], start: int, stop: int, buckets: int) -> list[int]:
    """Max of each of ``buckets`` equal slices of values[start:stop] (peaks must stay visible)."""
    stop = min(stop, len(values))
    span = stop - start
    if span <= 0 or buckets <= 0:
        return []
    if span <= buckets:
        return list(values[start:stop])
    out = []
    for b in range(buckets):
        lo = start + span * b // buckets
        hi = start + span * (b + 1) // buckets
        out.append(max(values[lo:max(hi, lo + 1)]))
    return out


def bucket_of(pass_no: int, start: int, stop: int, buckets: int) -> int:
    span = max(stop - start, 1)
    if span <= buckets:
        return pass_no - start
    return min((pass_no - start) * buckets // span, buckets - 1)


def pass_of_bucket(bucket: int, start: int, stop: int, buckets: int) -> int:
    span = max(stop - start, 1)
    if span <= buckets:
        return min(start + bucket, stop - 1)
    return min(start + span * bucket // buckets, stop - 1)


SPARK: Final = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[int], top: int | None = None) -> str:
    if not values:
        return ""
    top = max(values) if top is None else top
    if top <= 0:
        return SPARK[1] * len(values) if any(v < 0 for v in values) else " " * len(values)
    last = len(SPARK) - 1
    return "".join(SPARK[min(last, max(0, -(-v * last // top)))] for v in values)


def mark_buckets(marks: Marks, passes: int, buckets: int) -> str:
    """One character per timeline bucket; an error outranks a divergence, which outranks a stall."""
    cells = [" "] * buckets
    if passes <= 0:
        return "".join(cells)
    for start, end in marks.stall_ranges:
        for b in range(bucket_of(start, 0, passes, buckets), bucket_of(min(end, passes - 1), 0, passes, buckets) + 1):
            cells[b] = "▬"
    for points, ch in ((marks.divergence, "◆"), (marks.error, "✖")):
        for n in points:
            if 0 <= n < passes:
                cells[bucket_of(n, 0, passes, buckets)] = ch
    return "".join(cells)
