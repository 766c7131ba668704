"""Trace schema: the one contract between tracer/, replay/ and tui/.

Every record is a msgspec Struct encoded as a msgpack *array* whose first
element is the record's tag (``["pass", 17, ...]``), so a stock
``msgpack.Unpacker`` reads every record and field order is the schema.
Fields are only ever appended, with defaults: a reader ignores trailing
fields it does not know and fills missing trailing ones from defaults.
docs/trace-format.md is the prose version of this file; keep them in step.

No record holds prompt text or token ids: only rids, lengths and counts, and
a request's prefix identity as keyed block hashes (``Arrival.prefix_ids``)
whose key is never written.
"""

from __future__ import annotations

from typing import Final, Union

import msgspec

# The newest schema this code reads and writes. 1: every pass record is a full
# ``Pass``. 2: between keyframes a pass is a ``PassDelta`` (delta.py), which a
# v1 reader must refuse rather than skip; everything else is as in 1.
SCHEMA_VERSION: Final = 2


class _Record(msgspec.Struct, array_like=True, tag_field="type", omit_defaults=False):
    """Base of the tagged top-level records."""


class _Row(msgspec.Struct, array_like=True):
    """Base of nested rows (no tag)."""


# --- header -----------------------------------------------------------------


class ServerArgs(_Row):
    """The server args that change scheduling decisions."""

    schedule_policy: str
    chunked_prefill_size: int | None
    max_prefill_tokens: int
    page_size: int
    max_running_requests: int | None
    max_total_tokens: int | None
    attention_backend: str | None
    model_path: str
    enable_mixed_chunk: bool = False
    enable_priority_scheduling: bool = False
    disable_radix_cache: bool = False
    schedule_conservativeness: float = 1.0


class ChunkSizerFit(_Row):
    """sglang's dynamic-chunking latency model (``ChunkSizePredictor``), as fitted at start.

    f(l) = quadratic * l^2 + linear * l + constant, in milliseconds; a continuing chunk after
    l prefilled tokens gets the x with f(l + x) - f(l) = target_latency_ms (then smoothed,
    aligned and capped by sglang). The fit is measured on the recording host, so it is recorded.
    """

    quadratic: float
    linear: float
    constant: float
    target_latency_ms: float  # f(chunked_prefill_size) - f(0)
    context_len: int  # the model's context length: a chunk leaves 100 tokens below it


class PoolLayout(_Row):
    """The pools the scheduler built, as far as admission reads them.

    What replay needs to rebuild hybrid pools (SWA, mamba): the classes it
    must stand in for and the fixed sizes their budgets read. Per-pass counts
    are in ``KvSnapshot``.
    """

    allocator: str  # class name of token_to_kv_pool_allocator
    tree_cache: str  # class name of tree_cache
    full_size: int  # allocator.size_full: full-attention KV tokens
    swa_size: int | None = None  # allocator.size_swa (None: no SWA pool)
    swa_ring_cost: int = 0  # KV tokens one request's SWA ring takes (0: a paged SWA pool)
    sliding_window: int | None = None  # tree_cache.sliding_window_size (the SWA retain window)
    mamba_size: int | None = None  # mamba_allocator.size: state slots (None: no mamba pool)
    mamba_slots_per_req: int = 0  # slots a new request takes: its state plus its tracking buffers
    mamba_slot_cost: int = 0  # full tokens one state slot costs in a shared pool (0: a pool of its own)
    mamba_strategy: str | None = None  # --mamba-radix-cache-strategy as resolved
    mamba_extra_buffer: bool = False  # the tree keeps mamba ping-pong tracking buffers


class Header(_Record, tag="header"):
    schema_version: int
    sglang_version: str
    schedtrace_version: str
    host: str
    pid: int
    tp_rank: int
    dp_rank: int | None
    start_wall_ns: int  # time.time_ns() when t_ns == 0
    server_args: ServerArgs
    part: int = 0  # rotation index; part N continues part N-1
    first_pass: int = 0  # pass number of this part's first pass record
    # Real state the replayer must know but cannot infer from a pass.
    max_req_slots: int = 0  # req_to_token_pool size
    is_hybrid_swa: bool = False
    is_hybrid_mamba: bool = False
    # Grid a truncated prefill cut lands on (sglang's mamba_prefill_chunk_grid():
    # > 1 only with DCP and the mamba extra buffer); 1 leaves cuts alone.
    mamba_chunk_grid: int = 1
    # The pools' classes and sizes (None: a trace from before this field; then
    # only the full pool is known).
    pools: PoolLayout | None = None
    # sglang's _use_exact_chunk_fill() on the recording host (SGLANG_EXACT_CHUNK_FILL
    # on gfx95 hardware): PrefillAdder bills chunks exactly unless a mamba tree shares prefixes.
    exact_chunk_fill: bool = False
    # One server start: every rank's files share run_id; ranks and sizes come
    # from sglang.srt.runtime_context.get_parallel() (attn_dp_rank None: no DP attention).
    run_id: str = ""
    tp_size: int = 1
    dp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_tp_rank: int = 0
    attn_tp_size: int = 1
    attn_dp_rank: int | None = None
    attn_dp_size: int = 1
    # The scheduler ran sglang's overlap loop (event_loop_overlap): its enable_overlap, one pipeline
    # stage, no PD multiplexing. None: not recorded (older traces; replay infers it from the passes).
    overlap_schedule: bool | None = None
    # Tokens per block of ``Arrival.prefix_ids`` (the page size, or PREFIX_BLOCK_TOKENS on
    # page size 1); 0: the recorder wrote no prefix ids (older traces).
    prefix_block: int = 0
    # Every other setting sglang's scheduling code reads, by its sglang name: ``ServerArgs``
    # fields and environment settings (tracer/recorder/settings.py lists them). {}: older traces.
    settings: dict[str, int | float | str | bool | None] = {}
    # The dynamic chunk sizer's fit (--enable-dynamic-chunking with pp_size > 1, once its
    # profile fitted); None: chunks are sized statically, or an older trace.
    chunk_sizer: ChunkSizerFit | None = None

    @property
    def low_priority_values_first(self) -> bool:
        """--schedule-low-priority-values-first (a setting; False where a trace has none)."""
        return bool(self.settings.get("schedule_low_priority_values_first", False))


# --- pass (one scheduling pass that could admit work) -------------------------


class KvSnapshot(_Row):
    """Token counts of the KV pools at pass entry."""

    available: int  # free tokens in the full pool
    evictable: int  # tokens the radix cache could evict
    swa_available: int | None = None
    swa_evictable: int | None = None
    mamba_available: int | None = None  # free mamba state slots
    mamba_evictable: int | None = None  # state slots the radix cache could evict
    # Locked (protected) counts of the radix cache, hybrid pools only.
    protected: int | None = None
    swa_protected: int | None = None
    mamba_protected: int | None = None


class WaitingReq(_Row):
    """A queued request as the pass saw it (queue order at pass entry)."""

    rid: str
    input_len: int
    output_len: int  # > 0 only for retracted requests
    max_new_tokens: int
    prefix_len: int  # as known at pass entry; Candidate.prefix_len has this pass's match
    priority: int | None = None
    ignore_eos: bool = False


class RunningReq(_Row):
    rid: str
    input_len: int
    output_len: int
    max_new_tokens: int
    ignore_eos: bool = False


class ChunkedReq(_Row):
    """The in-flight chunked request at pass entry."""

    rid: str
    input_len: int
    prefix_len: int  # tokens already prefilled
    max_new_tokens: int
    output_len: int = 0
    ignore_eos: bool = False


class Candidate(_Row):
    """One ``PrefillAdder.add_one_req`` call and what it returned."""

    rid: str
    prefix_len: int
    extend_len: int  # admitted extend (0 if rejected)
    result: str  # CONTINUE | NO_TOKEN | OTHER
    # Tokens the evictable count dropped by when the adder first locked this
    # candidate's matched prefix (less than prefix_len where a running request
    # already pins part of it); 0 for an empty match (it pins only the root);
    # None: no lock taken, or not recorded (older traces).
    locked_evictable: int | None = None
    # The same drop on the SWA evictable count (hybrid SWA only; None: not recorded,
    # replay then assumes the prefix's last sliding window was evictable).
    locked_swa_evictable: int | None = None


class Admitted(_Row):
    rid: str
    prefix_len: int
    extend_len: int


class Released(_Row):
    """A running request priority preemption released in the pass, and the counts it left."""

    rid: str
    available: int  # free full-pool tokens right after its release
    evictable: int  # evictable tokens then


class ChunkOutcome(_Row):
    """How the continuing chunk of ``chunked`` was sized this pass."""

    rid: str
    budget: int | None  # PrefillBudget.available_chunk_tokens result (None = deferred)
    size: int | None  # extend admitted for it (None = not run this pass)


class Pass(_Record, tag="pass"):
    seq: int  # pass number within the trace (index into the footer)
    t_ns: int  # monotonic ns since the header's start
    dur_ns: int
    repeat: int  # identical consecutive passes folded into this record
    idle_before: int  # idle passes (nothing to admit) since the previous record
    # inputs
    waiting: list[WaitingReq]
    running: list[RunningReq]
    chunked: ChunkedReq | None
    batch_is_full_in: bool
    kv: KvSnapshot
    req_slots_free: int
    new_token_ratio: float
    chunked_prefill_size: int | None
    # outputs
    candidates: list[Candidate]
    admitted: list[Admitted]
    chunk: ChunkOutcome | None
    new_chunked_rid: str | None
    # The running batch's flag when admission ended (at batch construction; the
    # returned batch's where the pass built none; False when it raised).
    batch_is_full_out: bool
    error: str | None = None  # exception raised by the pass: "Type: message"
    # The order SchedulePolicy.calc_priority left the queue in, as runs (start, count) over
    # ``waiting`` (PassDelta's run form); None: the order at entry, or calc_priority did not run.
    order: list[int] | None = None
    # Scheduler.processed_tokens_counter at pass entry (hrrn's clock); None: not recorded.
    processed_tokens: int | None = None
    # Running requests priority preemption released, in order (None: none).
    released: list[Released] | None = None
    # Scheduler.forward_ct at pass entry (a folded record: its first pass's), recorded only under
    # sglang's SGLANG_TEST_RETRACT hook, which retracts every SGLANG_TEST_RETRACT_INTERVAL forwards.
    forward_ct: int | None = None


# --- events ----------------------------------------------------------------


class Arrival(_Record, tag="arrive"):
    t_ns: int
    rid: str
    input_len: int
    max_new_tokens: int
    priority: int | None = None
    ignore_eos: bool = False
    # Prefix identity: 8 bytes per block of ``Header.prefix_block`` input tokens (the last block
    # may be partial), each a keyed hash chained over every block before it, so equal prefixes
    # within one run have equal ids (tracer/contract/prefix_ids.py). b"": not recorded.
    prefix_ids: bytes = b""
    # Scheduler.processed_tokens_counter when the request was queued (hrrn's arrival stamp).
    processed_tokens: int | None = None
    # The request's routing key as one keyed hash (routing-key policy); None: it had none.
    routing_key: int | None = None


class Finish(_Record, tag="finish"):
    t_ns: int
    rid: str
    output_len: int
    reason: str  # "length", "stop", "abort", ..., or names.FINISH_REJECTED (refused, never queued)


class Abort(_Record, tag="abort"):
    t_ns: int
    rid: str


class Retract(_Record, tag="retract"):
    t_ns: int
    rid: str
    output_len: int


class Alloc(_Record, tag="alloc"):
    """One KV allocator call."""

    t_ns: int
    pass_seq: int  # last pass record written before it (-1: none)
    op: str  # "alloc_extend" | "alloc" | "alloc_decode" | "alloc_extend_swa_tail" | "mamba_alloc"
    requested: int  # tokens asked for
    available: int  # free tokens before the call
    evictable: int
    ok: bool


class Aiter(_Record, tag="aiter"):
    """One ``handle_attention_aiter`` dispatch."""

    t_ns: int
    forward_mode: str
    seq_lens_sum: int
    max_chunk_capacity: int
    in_piecewise_graph: bool
    in_breakable_graph: bool
    method: str
    pass_seq: int = -1  # last pass record written before it


class Clock(_Record, tag="clock"):
    """A wall/monotonic pair, written periodically, so ranks share one timeline."""

    t_ns: int  # monotonic ns since the header's start
    wall_ns: int  # time.time_ns() at the same instant


class Idle(_Record, tag="idle"):
    """Idle passes folded since the previous record (written before the next one)."""

    t_ns: int
    count: int


class Loss(_Record, tag="loss"):
    """The writer dropped ``count`` records (queue full or write error)."""

    t_ns: int
    count: int
    reason: str = "queue_full"


class HookError(_Record, tag="hook_error"):
    """A recorder hook raised; the sglang function still ran. Logged once per hook."""

    t_ns: int
    hook: str
    message: str
    count: int = 1


class Footer(_Record, tag="footer"):
    """Written on clean close. ``pass_offsets`` is little-endian uint64 byte offsets."""

    t_ns: int
    counts: dict[str, int]  # records written, by tag, plus "idle_passes", "lost"
    pass_offsets: bytes
    # v2: little-endian uint64 numbers (indexes into pass_offsets) of the keyframes, ascending.
    keyframes: bytes = b""


# --- v2: a pass as what changed since the previous pass record ------------------


class PassDelta(_Record, tag="delta"):
    """A pass between keyframes (schema v2), rebuilt against the pass record before it (delta.py).

    A list of rows is written as runs over the previous pass's list: pairs
    ``(start, count)``, where ``start`` >= 0 copies ``count`` rows from there
    and ``start`` == -1 takes the next ``count`` rows of the ``*_new`` list.
    The other fields are the pass's own, as in ``Pass``.
    """

    seq: int
    dt_ns: int  # t_ns minus the previous pass's t_ns
    dur_ns: int
    repeat: int
    idle_before: int
    waiting_runs: list[int]
    waiting_new: list[WaitingReq]  # joined, or changed, since the previous pass
    running_runs: list[int]
    running_new: list[RunningReq]
    running_step: int  # added to output_len of every running row the runs copy (the decode steps between)
    chunked: ChunkedReq | int | None  # int: the previous pass's chunked request, now with this prefix_len
    batch_is_full_in: bool
    kv: KvSnapshot
    req_slots_free: int
    new_token_ratio: float
    chunked_prefill_size: int | None
    candidates: list[Candidate]
    admitted: list[Admitted]
    chunk: ChunkOutcome | None
    new_chunked_rid: str | None
    batch_is_full_out: bool
    error: str | None = None
    order: list[int] | None = None
    processed_tokens: int | None = None
    released: list[Released] | None = None
    forward_ct: int | None = None


Record = Union[
    Header, Pass, Arrival, Finish, Abort, Retract, Alloc, Aiter, Clock, Idle, Loss, HookError, Footer, PassDelta
]
RECORD_TYPES: Final[dict[str, type]] = {
    cls.__struct_config__.tag: cls for cls in Record.__args__  # type: ignore[attr-defined]
}

# The last bytes of a cleanly closed file: ["tail", <footer offset as uint64>].
TAIL_TAG: Final = "tail"
TAIL_PREFIX: Final = b"\x92\xa4tail\xcf"
TAIL_SIZE: Final = len(TAIL_PREFIX) + 8
