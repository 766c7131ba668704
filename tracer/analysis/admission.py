"""Would sglang admit the next waiting request? A pure mirror of its own check.

sglang 0.5.23 admits in ``Scheduler._get_new_batch_prefill_raw`` through
``PrefillAdder`` (``add_chunked_req``, ``add_one_req`` →
``_select_prefill_admission``, ``add_one_req_ignore_eos``) and the base
``PrefillBudget``. ``head_check`` repeats that arithmetic on a recorded
``Pass`` and its trace's ``Header`` under the *fixed* logic (docs/fixes.md:
the latch re-evaluated every pass, one unfinished chunk at a time, the
continuing chunk sized by chunk-cap), without importing sglang: the budget
``rem_total_tokens`` = free + evictable (less the head's prefix lock) − the
running requests' decode reservation − what earlier admissions in the pass
reserved, against the head's need ``extend + decode + one page``, strictly.

The SWA pool's budget beside it is ``admission_hybrid.SwaBudget``; a mamba
pool's state slots are not read by admission. docs/replay-report.md ("The
stall rule") lists what is mirrored and what is not; where it is not, the
check's ``estimate`` says why.
tests/test_stall_rule.py holds it to the real code on every sample pass and on
generated states at the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Final

from schedtrace.tracer.analysis import admission_hybrid as hybrid
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.analysis.decision import replay_inputs
from schedtrace.tracer.analysis.queue_order import admission_order
from schedtrace.tracer.contract.names import SGLANG_CLIP_MAX_NEW_TOKENS_DEFAULT, SGLANG_CLIP_MAX_NEW_TOKENS_ENV, env_int
from schedtrace.tracer.contract.schema import ChunkedReq, Header, Pass, RunningReq, WaitingReq

# sglang's module constants, read from the same variables with the same defaults.
CLIP_MAX_NEW_TOKENS: Final = env_int(SGLANG_CLIP_MAX_NEW_TOKENS_ENV, SGLANG_CLIP_MAX_NEW_TOKENS_DEFAULT)
IGNORE_EOS_RESERVE_TOKENS: Final = 1
_CACHE_AWARE: Final = frozenset({"lpm", "dfs-weight", "hrrn", "shortest-prefill-first"})

# The server's configuration: the trace's header, or (older callers) max_running_requests alone.
ServerConfig = Header | int | None

# Verdicts of the check, in the scheduler's terms.
ADMITS: Final = "admits"
NO_SLOT: Final = "no-slot"  # can_run_list reached get_num_allocatable_reqs: batch_is_full
NO_TOKEN: Final = "no-token"  # the KV budget refused (AddReqResult.NO_TOKEN)
PASS_BUDGET: Final = "pass-budget"  # rem_input/rem_chunk spent (budget_state OTHER)
ONE_CHUNK: Final = "one-chunk"  # it needs a chunk while one is unfinished
EMPTY_CUT: Final = "empty-cut"  # its chunk rounds down to nothing
NO_HEAD: Final = "no-head"  # nobody left waiting


@dataclass(frozen=True)
class Limits:
    """What the admission check reads from the server's configuration."""

    page: int
    max_running: int | None  # pp_max_micro_batch_size (None: unknown, no limit)
    max_prefill_tokens: int | None  # None: unknown, no limit
    mixed_chunk: bool
    radix_cache: bool
    policy: str
    priority: bool
    grid: int  # mamba_prefill_chunk_grid(); > 1 is also the truncation alignment
    exact_fill: bool
    estimate: tuple[str, ...]  # what this mirror cannot repeat for the trace
    swa: hybrid.SwaLimits | None = None  # the SWA pool's budget (None: no SWA pool mirrored)
    recorded_order: bool = False  # the passes hold calc_priority's order (Pass.order)
    low_first: bool = False  # --schedule-low-priority-values-first


def limits_of(source: ServerConfig) -> Limits:
    """The limits of a trace's header; an int (or None) is only max_running_requests."""
    if not isinstance(source, Header):
        return Limits(1, source, None, False, True, "fcfs", False, 1, False,
                      ("no header given: page size 1, fcfs, no mixed chunk assumed",))
    args = source.server_args
    policy = args.schedule_policy
    if policy in _CACHE_AWARE and args.disable_radix_cache:
        policy = "fcfs"
    return Limits(
        page=max(1, args.page_size),
        max_running=capacity.micro_batch_cap(source),
        max_prefill_tokens=args.max_prefill_tokens,
        mixed_chunk=args.enable_mixed_chunk,
        radix_cache=not args.disable_radix_cache,
        policy=policy,
        priority=args.enable_priority_scheduling,
        grid=max(1, source.mamba_chunk_grid),
        # A mamba tree that shares prefixes bills chunks by page (PrefillAdder.__init__).
        exact_fill=source.exact_chunk_fill and not (source.is_hybrid_mamba and not args.disable_radix_cache),
        estimate=hybrid.hybrid_notes(source),
        swa=hybrid.swa_limits(source),
        recorded_order=source.prefix_block > 0,
        low_first=source.low_priority_values_first,
    )


@dataclass(frozen=True)
class HeadCheck:
    """The check of the next waiting request, with the numbers it used."""

    rid: str | None  # the request checked (None: nobody left waiting)
    verdict: str  # ADMITS, NO_SLOT, NO_TOKEN, PASS_BUDGET, ONE_CHUNK, EMPTY_CUT, NO_HEAD
    need: float = 0  # tokens the KV check asked for (0: not reached)
    budget: float = 0  # what it was compared with (rem_total_tokens on the usual path)
    bound: str = "rem_total_tokens"  # which budget: the usual path's, or the ignore_eos path's
    extend: int = 0  # the parts of ``need``: uncached tokens, decode reservation, page
    decode: int = 0
    page: int = 0
    free: int = 0  # the parts of ``budget``: free KV, evictable left after locks,
    evictable: int = 0
    reserved: float = 0  # and what running decodes and earlier admissions reserved
    slots: int = 0  # request slots left for it
    rem_chunk: int | None = None  # this pass's chunk and input token budgets left (None: no limit)
    rem_input: int | None = None
    admitted: int = 0  # requests admitted before it in this pass (the continuing chunk too)
    chunk: int | None = None  # extend of the continuing chunk run first (None: none, or deferred)
    chunk_budget: int | None = None  # available_chunk_tokens for it
    cut: int | None = None  # the head's chunk when it is admitted in part
    estimate: tuple[str, ...] = ()  # why this is not an exact mirror (empty: exact)

    @property
    def admits(self) -> bool:
        return self.verdict == ADMITS

    @property
    def exact(self) -> bool:
        return not self.estimate


def _ceil(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


@dataclass
class _Adder:
    """The counters one pass's PrefillAdder moves (mutated only in this module)."""

    limits: Limits
    available: int
    evictable: int
    total_offset: float
    current_offset: float
    rem_input: int | None
    rem_chunk: int | None
    allocatable: int  # get_num_allocatable_reqs before any row is held
    new_token_ratio: float
    running: list
    admitted: int = 0
    held_rows: int = 0
    chunk_in_flight: bool = False
    new_chunked: bool = False
    can_run: list = field(default_factory=list)
    req_states: list[tuple[float, int]] | None = None
    swa: hybrid.SwaBudget | None = None

    @property
    def remaining_total(self) -> float:
        return self.available + self.evictable - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.available + self.evictable - self.current_offset

    def pass_budget_spent(self) -> bool:
        """``budget_state() == OTHER`` (NO_TOKEN comes first and does not stop the loop)."""
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return False
        if self.swa is not None and self.swa.remaining() <= 0:
            return False
        return (self.rem_input is not None and self.rem_input <= 0) or (
            self.rem_chunk is not None and self.rem_chunk <= 0
        )

    def reserve(self, extend: int, max_new: int, continuation: bool = False) -> None:
        """``_update_prefill_budget`` on the pass's ``PrefillBudget``."""
        page = self.limits.page
        paged = _ceil(extend, page)
        if self.swa is not None:  # sized with the chunk budget before this charge
            self.swa.reserve(paged, max_new, self.rem_chunk, continuation)
        immediate = paged + page
        self.total_offset += immediate + max_new
        self.current_offset += immediate
        charge = extend if self.limits.exact_fill else paged
        if self.rem_input is not None:
            self.rem_input -= charge
        if self.rem_chunk is not None:
            self.rem_chunk -= charge

    def floor_chunk(self, cut: int, remaining: int) -> int:
        grid = self.limits.grid
        if grid <= 1 or cut >= remaining:
            return cut
        return cut // grid * grid or cut


def _start(p: Pass, limits: Limits) -> _Adder:
    mixed = len(p.running) if limits.mixed_chunk else 0
    ratio = p.new_token_ratio
    offset = mixed
    offset += sum(  # _get_running_request_total_token_offset, in the batch's order
        [min(r.max_new_tokens - r.output_len, CLIP_MAX_NEW_TOKENS) * (1.0 if r.ignore_eos else ratio) for r in p.running]
    )
    pp_budget = None if limits.max_running is None else limits.max_running - len(p.running)
    return _Adder(
        limits=limits,
        available=p.kv.available,
        evictable=p.kv.evictable,
        total_offset=offset,
        current_offset=mixed,
        rem_input=None if limits.max_prefill_tokens is None else limits.max_prefill_tokens - mixed,
        rem_chunk=None if p.chunked_prefill_size is None else p.chunked_prefill_size - mixed,
        allocatable=pp_budget if pp_budget is not None else 1 << 62,
        new_token_ratio=ratio,
        running=list(p.running),
        swa=hybrid.swa_budget(p, limits.swa),
    )


def _slots_left(a: _Adder, p: Pass) -> int:
    rows = max(p.req_slots_free + a.held_rows, 0)
    return min(a.allocatable, rows) - a.admitted


def _chunk_budget(a: _Adder) -> int | None:
    """``PrefillBudget.available_chunk_tokens`` with the chunk-cap fix (SWA: its own)."""
    limit, page = a.rem_chunk, a.limits.page
    if a.swa is not None:
        return a.swa.chunk_budget(limit, a.remaining_total)
    available = min(limit, int(a.remaining_total) - page)
    if available > 0:
        return available
    allocatable = min(limit, int(a.remaining_current) - page)
    return allocatable if allocatable > 0 else None


def _commit_chunk(a: _Adder, c: ChunkedReq, size: int) -> None:
    remaining = c.input_len + c.output_len - c.prefix_len
    truncated = size < remaining
    a.can_run.append(c)
    a.admitted += 1
    a.held_rows += 1  # a continuing chunk keeps its req_to_token row
    a.reserve(size, 0 if truncated else min(c.max_new_tokens, CLIP_MAX_NEW_TOKENS), continuation=True)
    a.chunk_in_flight = truncated


def _run_chunk(a: _Adder, c: ChunkedReq) -> tuple[int | None, int | None]:
    """``add_chunked_req`` under the fixed logic: (budget, extend run; None: deferred)."""
    budget = _chunk_budget(a)
    if budget is None:
        return None, None
    remaining = c.input_len + c.output_len - c.prefix_len
    size = a.floor_chunk(min(remaining, budget), remaining)
    _commit_chunk(a, c, size)
    return budget, size


def _prefix(w: WaitingReq, limits: Limits) -> int:
    """The match ``init_next_round_input`` takes: capped one short of the prompt."""
    return min(w.prefix_len, max(w.input_len + w.output_len - 1, 0)) if limits.radix_cache else 0


def _lock_share(a: _Adder, w: WaitingReq, prefix: int, locked: dict[str, int]) -> int:
    """Evictable tokens locking the match pins (the recorded drop; else all of it)."""
    if prefix == 0:
        return 0  # the root: nothing pinned
    share = min(locked.get(w.rid, prefix), prefix)
    return min(share, a.evictable)


def _state(a: _Adder, r: WaitingReq | RunningReq | ChunkedReq) -> tuple[float, int] | None:
    """(tokens left to decode, tokens held) of one request; None: nothing left."""
    left = r.max_new_tokens * (1.0 if r.ignore_eos else a.new_token_ratio) - r.output_len
    return (left, r.input_len + r.output_len) if left > 0 else None


def _with_state(a: _Adder, w: WaitingReq) -> list[tuple[float, int]]:
    """``add_req_state``: the decode states after ``w`` joins (a copy)."""
    own = _state(a, w)
    if a.req_states is None:
        rows = [own, *(_state(a, r) for r in a.running), *(_state(a, r) for r in a.can_run)]
        return sorted((s for s in rows if s is not None), key=lambda s: s[0])
    states = list(a.req_states)
    if own is not None:
        i = 0
        for i in range(len(states)):  # sglang's insert: before the last when none is larger
            if own[0] <= states[i][0]:
                break
        states.insert(i, own)
    return states


def _headroom_need(a: _Adder, w: WaitingReq, paged: int) -> float | None:
    """The decode-headroom walk of ``add_one_req_ignore_eos``: what it needed where it refused."""
    states = _with_state(a, w)
    current = a.remaining_current
    freed = 0
    for i, (left, occupied) in enumerate(states):
        bs = len(states) - i
        if current - paged + freed - left * bs <= IGNORE_EOS_RESERVE_TOKENS * bs:
            return paged + left * bs + IGNORE_EOS_RESERVE_TOKENS * bs - freed
        freed += occupied
    return None


def _check_ignore_eos(a: _Adder, w: WaitingReq, base: dict) -> HeadCheck:
    """``add_one_req_ignore_eos`` (radix cache off), after the one-chunk guard."""
    extend = w.input_len + w.output_len
    if (a.chunk_in_flight or a.new_chunked) and a.rem_chunk is not None and extend > a.rem_chunk:
        return HeadCheck(verdict=ONE_CHUNK, extend=extend, **base)
    page = a.limits.page
    paged = _ceil(extend, page) + page
    bound = min(a.remaining_current, a.remaining_total)
    numbers = dict(extend=extend, page=page, free=a.available, evictable=a.evictable, reserved=a.current_offset, **base)
    if not paged <= bound:
        return HeadCheck(verdict=NO_TOKEN, need=paged, budget=bound, bound="min(cur_rem, rem_total)", **numbers)
    if a.swa is not None:  # can_allocate_prefill's SWA side; the decode headroom walk is skipped for SWA
        swa_need = a.swa.tokens(extend, min(max(w.max_new_tokens - w.output_len, 0), CLIP_MAX_NEW_TOKENS), a.rem_chunk)
        if not swa_need <= a.swa.remaining():
            return HeadCheck(verdict=NO_TOKEN, need=swa_need, budget=a.swa.remaining(), bound=hybrid.SWA_BOUND, **numbers)
    elif (need := _headroom_need(a, w, paged)) is not None:
        return HeadCheck(verdict=NO_TOKEN, need=need, budget=a.remaining_current, bound="decode headroom", **numbers)
    cut = a.floor_chunk(a.rem_chunk, extend) if a.rem_chunk is not None and extend > a.rem_chunk else None
    return HeadCheck(verdict=ADMITS, need=paged, budget=bound, bound="min(cur_rem, rem_total)", cut=cut, **numbers)


def _head_cut(a: _Adder, prefix: int, limit: int) -> int:
    """``_select_prefill_admission``'s cut of a request longer than its chunk limit."""
    limits, page = a.limits, a.limits.page
    cut = limit if limits.exact_fill else limit // page * page
    if limits.grid > 1:  # the truncation alignment init_mamba_truncation_align derives from it
        cut = cut // limits.grid * limits.grid
    return cut if limits.exact_fill else (prefix + cut) // page * page - prefix


def _check(a: _Adder, w: WaitingReq, locked: dict[str, int], base: dict) -> HeadCheck:
    """``add_one_req`` for ``w`` on the adder's counts (the adder is not changed)."""
    limits = a.limits
    if a.pass_budget_spent():  # the loop's first test, before the slot test
        return HeadCheck(verdict=PASS_BUDGET, **base)
    if base["slots"] <= 0:
        return HeadCheck(verdict=NO_SLOT, **base)
    if w.ignore_eos and not limits.radix_cache:
        return _check_ignore_eos(a, w, base)
    page = limits.page
    prefix = _prefix(w, limits)
    extend = w.input_len + w.output_len - prefix
    decode = min(max(w.max_new_tokens - w.output_len, 0), CLIP_MAX_NEW_TOKENS)
    need = extend + decode + page
    evictable = a.evictable - _lock_share(a, w, prefix, locked)
    budget = a.available + evictable - a.total_offset
    numbers = dict(need=need, budget=budget, extend=extend, decode=decode, page=page,
                   free=a.available, evictable=evictable, reserved=a.total_offset, **base)
    verdict, cut = ADMITS, None
    fits, limit = need < budget, a.rem_chunk
    if fits and a.swa is not None:  # check_prefill's SWA bound, under the same prefix lock
        held = a.swa.lock_share(w.rid, prefix)
        fits, limit, swa_need = a.swa.check(_ceil(extend, page), decode, limit, held)
        if not fits:
            numbers.update(need=swa_need, budget=a.swa.remaining(held), bound=hybrid.SWA_BOUND)
    if not fits:
        verdict = NO_TOKEN
    elif a.rem_chunk is None:
        # Without chunking only the first request may exceed the input budget.
        if a.admitted and a.rem_input is not None and _ceil(extend, page) >= a.rem_input:
            verdict = PASS_BUDGET
    elif (extend if limits.exact_fill else _ceil(extend, page)) > limit:
        if a.chunk_in_flight or a.new_chunked:
            verdict = ONE_CHUNK
        else:
            cut = _head_cut(a, prefix, limit)
            verdict = ADMITS if cut > 0 else EMPTY_CUT
    return HeadCheck(verdict=verdict, cut=cut, **numbers)


def _commit(a: _Adder, w: WaitingReq, size: int, locked: dict[str, int]) -> None:
    """``_commit_prefill_admission`` (or the ignore_eos path's) for ``w`` admitted with ``size``."""
    limits = a.limits
    if w.ignore_eos and not limits.radix_cache:
        a.req_states = _with_state(a, w)
        full = w.input_len + w.output_len
    else:
        prefix = _prefix(w, limits)
        a.evictable -= _lock_share(a, w, prefix, locked)
        if a.swa is not None:
            a.swa.evictable -= a.swa.lock_share(w.rid, prefix)
        full = w.input_len + w.output_len - prefix
    chunked = size < full
    a.reserve(size, 0 if chunked else min(w.max_new_tokens, CLIP_MAX_NEW_TOKENS))
    a.new_chunked = a.new_chunked or chunked
    a.can_run.append(w)
    a.admitted += 1


def _pass_estimate(p: Pass, limits: Limits, order_note: str | None) -> tuple[str, ...]:
    notes = [*limits.estimate, *hybrid.pass_notes(p, limits.swa)]
    if order_note is not None:
        notes.append(order_note)
    if p.chunked is not None and p.chunked_prefill_size is None:
        notes.append("a continuing chunk without a chunk size")
    return tuple(notes)


def head_check(p: Pass, header: ServerConfig, after: list[tuple[str, int]] | None = None) -> HeadCheck:
    """Would the fixed logic admit the next waiting request of ``p``?

    ``after``: the ``(rid, extend)`` admissions made earlier in this pass (a
    ``Decision.admitted``, the continuing chunk first); the check runs on the
    counts they leave. ``None``: the fixed logic's own continuing chunk runs
    first (its budget and size are in the result) and nobody else.
    """
    p = replay_inputs(p)  # this pass's prefix matches on the waiting rows
    limits = limits_of(header)
    order, order_note = admission_order(p, limits.policy, limits.priority, recorded=limits.recorded_order,
                                        low_first=limits.low_first)
    estimate = _pass_estimate(p, limits, order_note)
    locked = {c.rid: c.locked_evictable for c in p.candidates if c.locked_evictable is not None}
    a = _start(p, limits)
    chunk = chunk_budget = None
    done: set[str] = set()
    chunked = p.chunked
    if after is None:
        if chunked is not None and a.rem_chunk is not None:
            chunk_budget, chunk = _run_chunk(a, chunked)
        a.chunk_in_flight = a.chunk_in_flight or (chunked is not None and chunk is None)
    else:
        by_rid = {w.rid: w for w in p.waiting}
        ran = False
        for rid, size in after:
            if chunked is not None and rid == chunked.rid:
                _commit_chunk(a, chunked, size)
                chunk, ran = size, True
            elif rid in by_rid:
                _commit(a, by_rid[rid], size, locked)
            done.add(rid)
        if chunked is not None and not ran:
            a.chunk_in_flight = True  # deferred: still the scheduler's chunked_req
    rest = [w for w in order if w.rid not in done]
    base = dict(slots=_slots_left(a, p), rem_chunk=a.rem_chunk, rem_input=a.rem_input, admitted=a.admitted, chunk=chunk, chunk_budget=chunk_budget, estimate=estimate)
    if not rest:
        return HeadCheck(rid=None, verdict=NO_HEAD, **base)
    head = rest[0]
    if base["slots"] <= 0 and chunked is None:  # no slot: the pass returns before the adder
        return HeadCheck(rid=head.rid, verdict=NO_SLOT, **base)
    check = _check(a, head, locked, dict(rid=head.rid, **base))
    if a.swa is not None and check.verdict not in (NO_SLOT, PASS_BUDGET):  # it read the SWA budget
        # the prefixes locked by then: the earlier admissions' and the head's
        notes = a.swa.lock_notes([(w.rid, _prefix(w, limits)) for w in p.waiting if w.rid in done or w is head])
        check = replace(check, estimate=check.estimate + notes)
    return check
