"""What one non-idle pass captures, on the scheduler thread, and the ``Pass`` it becomes.

A ``PassCapture`` is taken at pass entry, filled per candidate by the
``PrefillAdder``/``PrefillBudget`` hooks while the pass runs, closed at pass
exit, and then handed to the writer thread, which calls ``build()``: the
schema Structs are made there, not on the scheduler thread. Once submitted,
the scheduler thread never touches it again.

Which ``Req`` fields are safe to read later (sglang 0.5.23): ``rid``,
``len(origin_input_ids)``, ``sampling_params.max_new_tokens``,
``sampling_params.ignore_eos`` and ``priority`` are all set before
``Scheduler._add_request_to_queue`` appends the request (tokenizer-side
normalisation, ``init_req_max_new_tokens``, multimodal padding,
``set_finish_with_abort`` and ``_set_or_validate_priority`` all run in
``handle_generate_request`` / the grammar queue, before queueing) and are
never written again while it is queued, running or chunked. Volatile, and so
captured as ints at pass entry: ``prefix_len`` (``init_next_round_input``,
``reset_for_retract``) and ``len(output_ids)`` (every decode step, retract).
Lengths and counts only, never token ids or text.
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.names import error_text
from schedtrace.tracer.contract.order import order_runs
from schedtrace.tracer.contract.schema import Admitted, Candidate, ChunkOutcome, Pass, Record, Released
from schedtrace.tracer.recorder import pools, rows
from schedtrace.tracer.recorder.writer_thread import Deferred


class PassCapture(Deferred):
    """References to the live requests plus the few ints that can change.

    Lists are copied (sglang sorts and filters its own in place); the ints
    are ``prefix_len`` and ``len(output_ids)`` per request, the KV counts and
    flags. ``build()`` adds the fields that never change once a request is
    queued.
    """

    __slots__ = (
        "t_ns", "dur_ns", "repeat", "idle_before",
        "waiting", "waiting_prefix", "waiting_out", "running", "running_out",
        "chunked", "chunked_prefix", "chunked_out", "batch_is_full_in",
        "kv", "req_slots_free", "new_token_ratio", "chunked_prefill_size",
        "candidates", "admitted", "chunk", "new_chunked_rid", "batch_is_full_out", "error",
        "in_chunk", "budget", "events", "slots", "order", "processed_tokens", "batch", "full_at_batch", "released",
        "forward_ct",
    )

    def __init__(self, scheduler: Any, running_batch: Any, t_ns: int, readers: pools.PoolReaders) -> None:
        """Pass entry: everything the pass reads that may change before the writer gets to it."""
        self.t_ns = t_ns
        self.dur_ns = 0
        self.repeat = 1
        self.idle_before = 0
        # Comprehensions written out, not ``map(attrgetter(...))`` or a helper: on these
        # many-attribute objects the interpreter's specialised attribute reads are about
        # 1.5x faster, and a helper is one more call per list.
        waiting = list(scheduler.waiting_queue)
        self.waiting = waiting
        self.waiting_prefix = [req.prefix_len for req in waiting]
        self.waiting_out = [len(req.output_ids) for req in waiting]
        self.batch = running_batch  # until close: batch construction reads its flag
        self.full_at_batch: bool | None = None
        self.released: list[Released] | None = None  # running requests preemption released
        self.forward_ct: int | None = None  # set under sglang's SGLANG_TEST_RETRACT hook (Recorder.begin_pass)
        if running_batch is not None:
            running = list(running_batch.reqs)
            self.batch_is_full_in = bool(running_batch.batch_is_full)
        else:
            running = []
            self.batch_is_full_in = False
        self.running = running
        self.running_out = [len(req.output_ids) for req in running]
        chunked = scheduler.chunked_req
        self.chunked = chunked
        if chunked is not None:
            self.chunked_prefix = chunked.prefix_len
            self.chunked_out = len(chunked.output_ids)
            self.chunked_prefill_size = continuing_chunk_size(scheduler, chunked)
        else:
            self.chunked_prefix = self.chunked_out = 0
            self.chunked_prefill_size = scheduler.chunked_prefill_size  # the sizer sizes only a chunk
        self.kv = readers.counts()
        self.req_slots_free = scheduler.req_to_token_pool.available_size()
        self.processed_tokens = getattr(scheduler, "processed_tokens_counter", None)
        self.order: list[int] | None = None  # entry indexes in calc_priority's order (None: unchanged)
        self.new_token_ratio = float(scheduler.new_token_ratio_tracker.current)
        # (req, prefix_len, extend_len, AddReqResult, locked_evictable, locked_swa_evictable) per add_one_req call
        self.candidates: list[tuple] = []
        # (req, prefix_len, extend_len) per admitted request, the continuing chunk first
        self.admitted: list[tuple] = []
        self.chunk: ChunkOutcome | None = None
        self.new_chunked_rid: str | None = None
        self.batch_is_full_out = False
        self.error: str | None = None
        self.in_chunk = False  # inside add_chunked_req: the budget hook keeps its result
        self.budget: int | None = None
        self.events: list[Record] = []  # emitted during the pass: written after it
        self.slots: SlotTally | None = None  # the pass's mamba state slots, from its first (in events)

    # --- while the pass runs ---

    def sorted(self, policy: Any, queue: list) -> None:
        """``calc_priority`` returned: keep the order it left ``queue`` in, and, where it matched
        prefixes (sglang's own ``waiting_queue_prefix_matched``), this pass's match of each row."""
        entry = self.waiting
        if queue == entry:  # Req has no __eq__: an identity compare, in C
            perm = None
        else:
            at = {id(req): i for i, req in enumerate(entry)}
            perm = self.order = [at[id(req)] for req in queue]
        if policy.waiting_queue_prefix_matched(queue):
            prefix = self.waiting_prefix
            if perm is None:
                self.waiting_prefix = [req.prefix_len for req in queue]
            else:
                for req, i in zip(queue, perm):
                    prefix[i] = req.prefix_len

    def release(self, rid: str, available: int, evictable: int) -> None:
        """Priority preemption released running request ``rid``, leaving these counts."""
        if self.released is None:
            self.released = []
        self.released.append(Released(rid, available, evictable))

    def batch_built(self) -> None:
        """``ScheduleBatch.init_new`` ran: admission is over."""
        batch = self.batch
        if batch is not None:
            self.full_at_batch = bool(batch.batch_is_full)

    def add_chunk(self, req: Any, ran: bool) -> None:
        """The ``add_chunked_req`` call: what the budget offered the continuing chunk and what ran."""
        size = req.extend_len if ran else None
        self.chunk = ChunkOutcome(req.rid, self.budget, size)
        if ran:
            self.admitted.append((req, req.prefix_len, size))

    def close(self, scheduler: Any, result: Any, error: BaseException | None, t_ns: int) -> bool:
        """Pass exit; True if the pass is foldable (it admitted and changed nothing)."""
        self.dur_ns = t_ns - self.t_ns
        new_chunked = scheduler.chunked_req
        if new_chunked is not None and new_chunked is not self.chunked:
            self.new_chunked_rid = new_chunked.rid
        if self.full_at_batch is not None and error is None:
            # The flag as admission left it: the mixed-chunk step after batch construction
            # clears it for requests the overlap loop is finishing, state no pass holds.
            self.batch_is_full_out = self.full_at_batch
        elif isinstance(result, tuple) and len(result) == 2 and result[1] is not None:
            self.batch_is_full_out = bool(result[1].batch_is_full)
        self.batch = None
        if error is not None:
            self.error = error_text(error)
        return not self.admitted and self.chunk is None and self.new_chunked_rid is None and not self.events

    def fold_key(self) -> tuple:
        """Equal keys <=> equal ``Pass`` records but for timing. ``Req`` has no
        ``__eq__``, so its lists compare by identity; the held pass keeps them alive."""
        return (
            self.waiting, self.waiting_prefix, self.waiting_out, self.running, self.running_out,
            self.chunked, self.chunked_prefix, self.chunked_out, self.batch_is_full_in, self.kv,
            self.req_slots_free, self.new_token_ratio, self.chunked_prefill_size,
            self.candidates, self.batch_is_full_out, self.error, self.order, self.processed_tokens, self.released,
        )

    # --- writer thread ---

    def build(self) -> Pass:
        chunked = self.chunked
        return Pass(
            0, self.t_ns, self.dur_ns, self.repeat, self.idle_before,
            rows.waiting_rows(self.waiting, self.waiting_prefix, self.waiting_out),
            rows.running_rows(self.running, self.running_out),
            rows.chunked_row(chunked, self.chunked_prefix, self.chunked_out) if chunked is not None else None,
            self.batch_is_full_in, pools.kv_row(self.kv), self.req_slots_free, self.new_token_ratio,
            self.chunked_prefill_size, self._candidate_rows(), self._admitted_rows(), self.chunk,
            self.new_chunked_rid, self.batch_is_full_out, self.error,
            order_runs(self.order) if self.order is not None else None, self.processed_tokens, self.released,
            self.forward_ct,
        )

    def _candidate_rows(self) -> list[Candidate]:
        return [
            Candidate(req.rid, prefix_len, extend_len, getattr(result, "name", str(result)), locked, locked_swa)
            for req, prefix_len, extend_len, result, locked, locked_swa in self.candidates
        ]

    def _admitted_rows(self) -> list[Admitted]:
        return [Admitted(req.rid, prefix_len, extend_len) for req, prefix_len, extend_len in self.admitted]


class SlotTally(Deferred):
    """Mamba state-slot allocations written as one ``mamba_alloc``: every slot of a pass,
    or of a request-row binding outside one (``HybridReqToTokenPool.alloc``), or one call.

    ``free_slots`` is the free list before the first (``rows.mamba_alloc_row`` takes its
    length); ``granted`` is False from the first refused slot on, and ``evictable`` is
    the tree's evictable state slots read then (0 while every slot was granted).
    """

    __slots__ = ("t_ns", "asked", "free_slots", "granted", "evictable")

    def __init__(self, t_ns: int, free_slots: Any) -> None:
        self.t_ns = t_ns
        self.asked = 0
        self.free_slots = free_slots
        self.granted = True
        self.evictable = 0

    def build(self) -> Record:
        return rows.mamba_alloc_row(self.t_ns, self.asked, self.free_slots, self.evictable, self.granted)


def continuing_chunk_size(scheduler: Any, chunked: Any) -> int | None:
    """The chunked_prefill_size the pass will use for ``chunked`` (the dynamic sizer's, if any)."""
    sizer = getattr(scheduler, "dynamic_chunk_sizer", None)
    if sizer is not None:
        predicted = sizer.predict(chunked.prefix_len)
        if predicted is not None:
            return predicted
    return scheduler.chunked_prefill_size


def finish_reason(req: Any) -> str:
    """The finish type as sglang reports it ("length", "stop", "abort", ...)."""
    reason = req.finished_reason
    if reason is None:
        return "unknown"
    try:
        kind = reason.to_json().get("type")
    except Exception:  # a reason class without to_json: fall back to its name
        kind = None
    return str(kind) if kind else type(reason).__name__
