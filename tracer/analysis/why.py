"""Why a pass admitted nothing (more): one line in the scheduler's own terms.

``why`` explains one pass under one arm's decision (the recorded one by
default): after what that arm admitted, the next waiting request is checked
by ``admission.head_check`` (sglang's own arithmetic, fixed logic) and the
line gives the numbers it used::

    latched since 866; 4 slots free; head needs 2415, budget 2421 → the latch fix admits
    budget 2414 ≤ head 2415 (307 free + 2980 evictable − 873 reserved) → back-pressure

``why_trace`` walks passes in order and also says since which pass the
``batch_is_full`` latch has held (``latch_since``: the one rule, which the
browser's scan uses too). Pure: no sglang import, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from schedtrace.tracer.analysis import admission as adm
from schedtrace.tracer.analysis.admission import HeadCheck, ServerConfig, head_check
from schedtrace.tracer.analysis.admission_hybrid import SWA_BOUND
from schedtrace.tracer.analysis.decision import recorded_decision
from schedtrace.tracer.contract.report import Decision
from schedtrace.tracer.contract.schema import Header, Pass

# Reasons, one per line kind (Why.reason).
ERROR = "error"
DRAINED = "drained"  # everyone waiting got in
LATCH = "latch"  # the latch held the queue although the check admits
STALL = "stall"  # the check admits, the arm did not, and no latch explains it
BACK_PRESSURE = "back-pressure"  # the KV budget refused
FULL = "full"  # no request slot
# The check's own verdicts, as its reasons: this pass's chunk or input budget is spent; a chunk
# while one is unfinished; a chunk that rounds down to nothing.
PASS_BUDGET, ONE_CHUNK, EMPTY_CUT = adm.PASS_BUDGET, adm.ONE_CHUNK, adm.EMPTY_CUT


@dataclass(frozen=True)
class Why:
    seq: int
    reason: str
    text: str
    check: HeadCheck | None  # the check behind the line (None: the pass raised)


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.1f}"


def _budget_text(c: HeadCheck) -> str:
    if c.bound == "rem_total_tokens":
        parts = f"{c.free} free + {c.evictable} evictable − {_num(c.reserved)} reserved"
        return f"budget {_num(c.budget)} ≤ head {_num(c.need)} ({parts})"
    if c.bound == SWA_BOUND:
        return f"SWA budget {_num(c.budget)} too small for head's {_num(c.need)} SWA tokens ({SWA_BOUND})"
    return f"{c.bound} {_num(c.budget)} ≤ head {_num(c.need)} (ignore_eos path)"


def _latched(p: Pass, header: ServerConfig) -> bool:
    """Stock sglang keeps a latched flag over a non-empty batch (hybrid SWA resets it)."""
    swa = isinstance(header, Header) and header.is_hybrid_swa
    return p.batch_is_full_in and bool(p.running) and not swa


def _refusal(c: HeadCheck, p: Pass) -> tuple[str, str]:
    if c.verdict == adm.NO_TOKEN:
        return BACK_PRESSURE, f"{_budget_text(c)} → back-pressure"
    if c.verdict == adm.NO_SLOT:
        return FULL, f"no request slot ({len(p.running)} running, {p.req_slots_free} rows free) → batch full"
    if c.verdict == adm.PASS_BUDGET:
        if c.rem_chunk is not None and c.rem_chunk <= 0:
            return PASS_BUDGET, f"chunk budget spent (rem_chunk_tokens {c.rem_chunk}) → next pass"
        head = f", head {c.extend}" if c.extend else ""
        return PASS_BUDGET, f"input budget spent (rem_input_tokens {c.rem_input}{head}) → next pass"
    if c.verdict == adm.ONE_CHUNK:
        chunked = p.chunked.rid[:8] if p.chunked is not None else "a new chunk"
        return ONE_CHUNK, f"head needs a chunk while {chunked} is unfinished → waits (one chunked request)"
    return EMPTY_CUT, f"head's chunk rounds down to {c.cut} tokens → waits"


def why(
    p: Pass,
    header: ServerConfig,
    decision: Decision | None = None,
    *,
    latched_since: int | None = None,
) -> Why:
    """Why ``p`` admitted nothing more under ``decision`` (default: the recorded one)."""
    d = recorded_decision(p) if decision is None else decision
    if d.error is not None:
        return Why(p.seq, ERROR, f"raised {d.error}", None)
    c = head_check(p, header, list(d.admitted))
    note = f" (estimate: {'; '.join(c.estimate)})" if c.estimate else ""
    lead = f"admitted {len(d.admitted)}; next {c.rid[:8]}: " if d.admitted and c.rid else ""
    if c.verdict == adm.NO_HEAD:
        return Why(p.seq, DRAINED, f"admitted {len(d.admitted)}; nobody left waiting{note}", c)
    head = f"head needs {_num(c.need)}, budget {_num(c.budget)}"
    if c.admits and _latched(p, header):
        since = f"latched since {latched_since}" if latched_since is not None else "latched"
        text = f"{since}; {c.slots} slots free; {head} → the latch fix admits"
        return Why(p.seq, LATCH, lead + text + note, c)
    if c.admits:
        return Why(p.seq, STALL, f"{lead}{head}, {c.slots} slots free, yet not admitted → stall{note}", c)
    reason, text = _refusal(c, p)
    if _latched(p, header) and not d.admitted:
        since = f" since {latched_since}" if latched_since is not None else ""
        text = f"latched{since}, and {text}"
    return Why(p.seq, reason, lead + text + note, c)


def why_trace(
    passes: Iterable[Pass],
    header: ServerConfig,
    decisions: Sequence[Decision] | None = None,
) -> Iterator[Why]:
    """``why`` for each pass in order, with the pass whose recorded outcome latched ``batch_is_full``."""
    since: int | None = None
    for n, p in enumerate(passes):
        yield why(p, header, None if decisions is None else decisions[n], latched_since=since if p.batch_is_full_in else None)
        since = latch_since(since, p.seq, p.batch_is_full_in, p.batch_is_full_out)


def latch_since(since: int | None, seq: int, batch_is_full_in: bool, batch_is_full_out: bool) -> int | None:
    """The pass whose outcome latched ``batch_is_full``, after pass ``seq`` (None: not latched).

    ``since`` is the answer before it. A clear outcome ends the latch; an
    outcome that sets the flag anew (it was clear on entry) names its own pass.
    """
    if not batch_is_full_out:
        return None
    return seq if since is None or not batch_is_full_in else since
