"""Re-drive sglang's own scheduling code on one recorded pass.

Stable API (closed-loop replay and bisect build on it)::

    driver = PassDriver(header)                  # once per trace
    decision = driver.decide(pass_, "stock")     # -> schedtrace.tracer.contract.report.Decision
    method = driver.decide_aiter(aiter, "fixed") # -> AttnForwardMethod name

``decide`` reads only the *input* fields of the pass (``waiting``,
``running``, ``chunked``, ``batch_is_full_in``, ``kv``, ``req_slots_free``,
``new_token_ratio``, ``chunked_prefill_size``, and each candidate's
``locked_evictable``: what locking its prefix took from the evictable count,
an input of the cache like the match itself) and returns what the real
``Scheduler._get_new_batch_prefill_raw`` decides under ``variant`` (a name
``schedtrace.arms.variants.applied`` accepts: ``stock``, ``fixed``, one fix or a
comma list). It is deterministic: no wall clock, no randomness, no state
carried from one call to the next. Exceptions the real code raises become
``Decision.error``; a record that cannot be turned into sglang state raises
``ReplayStateError``.

How: the real ``Scheduler`` method runs on ``Scheduler.__new__(Scheduler)``
with the attributes it reads set from the header and the pass (see
``schedtrace.replay.state`` for the three recorded stand-ins). The pass is stopped right
after admission: ``ScheduleBatch.init_new`` is swapped, for the duration of
the call only, for one that raises with the admitted list, so no batch is
built and nothing is allocated. What ``alloc_extend`` would have been asked
for is computed from that list to find over-asks.

The recorded server's settings (its published config, the mamba chunk grid,
import-time constants) are installed around each call: ``schedtrace.replay.server_env``.

Hybrid pools (``schedtrace.replay.hybrid``): SWA on a real ``SWATokenToKVPoolAllocator``
stand-in (``SWAPrefillBudget`` sizes admission), mamba on a ``MambaSlotAllocator`` stand-in
and a tree that ``supports_mamba()``; ``Header.exact_chunk_fill`` is injected like the grid.
What the trace cannot re-derive comes from ``Pass.order``: ``random``'s draw, and the text
order of routing keys (``schedtrace.replay.routing_keys``).

Not thread-safe: the variant patches and the stop hook touch process-global
functions, so calls are serialised by a module lock.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

from schedtrace.tracer.contract.report import Decision
from schedtrace.arms.fixes import FIX_NAMES
from schedtrace.replay.arm_switch import fixes_of, restore_fixes, switch_fixes
from schedtrace.replay.hybrid import MAMBA, SWA, pool_family
from schedtrace.replay.state import (
    RecordedAllocator,
    RecordedHybridReqSlots,
    RecordedReqSlots,
    RecordedSWAAllocator,
    RecordedTreeCache,
)
from schedtrace.replay.loop.draws import RANDOM
from schedtrace.replay.loop.preemption import NO_RELEASES, Releases, requeued_at
from schedtrace.replay.aiter_dispatch import aiter_method
from schedtrace.replay.pass_standins import AdmissionDone, Ratio, keep_rows, stop_init_new
from schedtrace.replay.server_env import (PublishedConfig, per_request_envs, recorded_constants, recorded_grid,
                                         swap_constants)
from schedtrace.replay.routing_keys import ROUTING_KEY, keys_renamed, recorded_names
from schedtrace.replay.requests import (ArrivalBook, ReqCache, TokenSource, batch_defaults, chunked_req, running_req,
                                       waiting_req)
from schedtrace.tracer.analysis import capacity
from schedtrace.tracer.contract.errors import ReplayStateError
from schedtrace.tracer.contract.names import error_text  # "Type: message", as the recorder writes Pass.error
from schedtrace.tracer.contract.order import OrderError, order_indexes, order_runs
from schedtrace.tracer.contract.schema import Aiter, Arrival, Finish, Header, Pass, Retract

_LOCK = threading.RLock()
BUILT_IN = frozenset(FIX_NAMES)


def reads_queue_early(fixes: frozenset[str]) -> bool:
    """Whether an arm's code may read the waiting queue before calc_priority: a user's may."""
    return not fixes <= BUILT_IN


# Scheduler attributes the pass reads for features a replayed pass never has on.
_OFF_IN_REPLAY: dict[str, Any] = dict(min_free_slots_delayer=None, dynamic_chunk_sizer=None, max_prefill_bs=0,
                                      dllm_config=None, enable_lora=False, enable_hicache_storage=False,
                                      enable_lmcache=False)


class PassDriver:
    """Runs the real scheduler pass for recorded inputs under a logic variant."""

    def __init__(self, header: Header) -> None:
        from sglang.srt.managers import schedule_policy as policy_module
        from sglang.srt.managers import scheduler as scheduler_module
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy

        args = header.server_args
        family = pool_family(header)  # refuses pools replay cannot rebuild
        self.header = header
        self.page_size = max(1, args.page_size)
        self._scheduler_module = scheduler_module
        self._policy_module = policy_module
        self.mamba_chunk_grid = max(1, header.mamba_chunk_grid)
        self._ScheduleBatch = ScheduleBatch
        self._batch_defaults = batch_defaults(ScheduleBatch)
        self._PrefillAdder = PrefillAdder
        slots = capacity.request_slots(header)
        settings = header.settings
        low_first = header.low_priority_values_first
        config = {
            "pp_max_micro_batch_size": capacity.micro_batch_cap(header),
            "schedule_policy": args.schedule_policy,
            "page_size": self.page_size,
            "enable_priority_scheduling": args.enable_priority_scheduling,
            "disable_radix_cache": args.disable_radix_cache,
            "schedule_low_priority_values_first": low_first,
        }
        if settings.get("prefill_max_requests") is not None:
            config["prefill_max_requests"] = settings["prefill_max_requests"]
        self._config = PublishedConfig(config)
        # Module constants sglang read from the environment at import, as the server had them, and the
        # answers to the settings it reads per request.
        self._constants = recorded_constants(settings) + per_request_envs(settings)
        layout = header.pools
        if family == MAMBA:
            self.req_slots = RecordedHybridReqSlots(slots, layout.mamba_size or 0)
        else:
            self.req_slots = RecordedReqSlots(slots)
        if family == SWA:
            self.allocator = RecordedSWAAllocator(layout, self.page_size, self.req_slots)
        else:
            self.allocator = RecordedAllocator(args.max_total_tokens or 0, self.page_size)
        self.tree_cache = RecordedTreeCache(
            disable=args.disable_radix_cache,
            page_size=self.page_size,
            allocator=self.allocator,
            req_slots=self.req_slots,
            mamba=family == MAMBA,
            sliding_window=layout.sliding_window if family == SWA else None,
            prefix_block=header.prefix_block,
        )
        with self._config.installed():
            self.policy = SchedulePolicy(
                args.schedule_policy,
                self.tree_cache,
                enable_hierarchical_cache=False,
                enable_priority_scheduling=args.enable_priority_scheduling,
                schedule_low_priority_values_first=low_first,
            )
        # calc_priority's order is a decision output (Decision.queue_order); under ``random``
        # it is the recorded one (Pass.order), since the draw cannot be made again.
        self._random = args.schedule_policy == RANDOM
        self._routing = args.schedule_policy == ROUTING_KEY
        self.policy.calc_priority = self._calc_priority
        self._order: list[int] | None = None
        self._recorded_order: list[int] | None = None
        self.scheduler = self._new_scheduler()
        grid = self.mamba_chunk_grid
        self._grid_lookup = lambda: grid
        exact = header.exact_chunk_fill
        self._exact_fill_lookup = lambda: exact
        self._stop_init_new = classmethod(stop_init_new)
        self.book = ArrivalBook(header.prefix_block)  # each live request's prefix ids (note)
        self._reqs = ReqCache(self.book)  # Reqs reused across passes (schedtrace.replay.requests)
        self._sort_randomly = staticmethod(self._recorded_shuffle)
        self._releases = NO_RELEASES  # this pass's (_load); none without priority preemption
        self._unbuilt: Pass | None = None  # decide's pass, until _calc_priority takes its waiting Reqs
        self._built: list | None = None  # those Reqs, in the pass's order

    def note(self, record: Arrival | Finish | Retract | Pass) -> None:
        """What a queued request carries between passes, from arrival to finish: prefix ids, priority, queue
        entry time. A retraction re-queues it, as does a priority preemption release at the end of its
        pass (``_add_request_to_queue`` stamps the entry time the next preemption ranks victims by)."""
        kind = type(record)
        if kind is Arrival:
            self.book.note(record)
        elif kind is Retract:
            self.book.requeued(record.rid, record.t_ns)
            self._reqs.drop_running(record.rid)  # its Req from before holds the old entry time
        elif kind is Pass:
            if record.released:
                self.requeue_released(record, [r.rid for r in record.released])
        else:
            self.book.forget(record.rid)

    def start_over(self, history: list[Arrival | Retract]) -> None:
        """Forget what the requests went through and note ``history`` instead: each closed-loop
        arm starts from the recorded start, not from where the arm before it left its requests
        (under priority preemption their queue entry times rank the victims)."""
        self.book.live.clear()
        self._reqs.reset()
        for record in history:
            self.note(record)

    def requeue_released(self, p: Pass, rids: list[str]) -> None:
        """Requests ``p``'s preemption released re-enter the queue at the end of ``p``, one after another
        in the order released: the next preemption takes the newest first. A running Req an arm that
        did not release it kept holds the old entry time, so it goes, as a retraction's does."""
        for order, rid in enumerate(rids):
            self.book.requeued(rid, requeued_at(p.t_ns + p.dur_ns, order))
            self._reqs.drop_running(rid)

    @property
    def reads_history(self) -> bool:
        """Whether a range replayed from the middle needs the events before it (``note``)."""
        return self.book.block > 0 or bool(self.scheduler.enable_priority_preemption)

    def _release(self, batch: Any, idx: int, remaining: int, offload_kv: bool = True) -> bool:
        """``ScheduleBatch.release_req`` under priority preemption: the pools' counts after it
        (``schedtrace.replay.loop.preemption``); the request is reset as sglang resets it."""
        req = batch.reqs[idx]
        pool = self.allocator if isinstance(self.allocator, RecordedAllocator) else self.allocator.full_attn_allocator
        pool.available, self.tree_cache.evictable = self._releases.counts(
            req.rid, pool.available, self.tree_cache.evictable)
        req.kv.req_pool_idx = None  # its row went back to the pool (ReqToTokenPool.free)
        req.kv.mark_kv_released()
        req.reset_for_retract()
        self._reqs.drop_running(req.rid)  # changed beyond what the next pass re-derives
        return True

    def _calc_priority(self, waiting_queue: list, running_batch: Any = None, *args: Any, **kwargs: Any) -> None:
        if self._unbuilt is not None:  # the pass reads its waiting requests from here on
            waiting_queue[:] = self._built = self._reqs.waiting_reqs(self._unbuilt)
            self._unbuilt = None
        entry = list(waiting_queue)
        reqs, names = [], {}
        if self._routing:  # ties break by the keys' text, which only the recorded order shows
            reqs = [*entry, *getattr(running_batch, "reqs", ())]
            names = recorded_names(entry, self._recorded_indexes(len(entry), ROUTING_KEY))
        with keys_renamed(reqs, names):
            type(self.policy).calc_priority(self.policy, waiting_queue, running_batch, *args, **kwargs)
        if waiting_queue == entry:
            self._order = None
        else:
            at = {id(req): i for i, req in enumerate(entry)}
            self._order = order_runs([at[id(req)] for req in waiting_queue])

    def _recorded_shuffle(self, waiting_queue: list) -> None:
        """``SchedulePolicy._sort_randomly`` in replay: the recorded draw."""
        order = self._recorded_indexes(len(waiting_queue), RANDOM)
        waiting_queue[:] = [waiting_queue[i] for i in order]

    def _recorded_indexes(self, n: int, policy: str) -> list[int]:
        try:
            return order_indexes(self._recorded_order, n)
        except OrderError as exc:
            raise ReplayStateError(f"{policy} policy: the recorded order is damaged: {exc}") from None

    # ------------------------------------------------------------------ setup

    def _new_scheduler(self):
        """``Scheduler.__new__`` with exactly the attributes the pass reads."""
        from types import SimpleNamespace

        from sglang.srt.managers.scheduler import Scheduler

        args = self.header.server_args
        s = Scheduler.__new__(Scheduler)
        s.grammar_manager = SimpleNamespace(has_waiting_grammars=lambda: False)
        s.__dict__.update(_OFF_IN_REPLAY)
        settings = self.header.settings
        # As Scheduler.__init__ derives it: priority scheduling preempts unless told not to.
        s.enable_priority_preemption = args.enable_priority_scheduling and not settings.get(
            "disable_priority_preemption", True)
        s.is_hybrid_swa = self.header.is_hybrid_swa  # resets batch_is_full every pass
        s.processed_tokens_counter = 0
        s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=None, prefill_aware_swa=False))
        s.page_size = self.page_size
        s.tree_cache = self.tree_cache
        s.token_to_kv_pool_allocator = self.allocator
        s.req_to_token_pool = self.req_slots
        s.max_prefill_tokens = args.max_prefill_tokens
        s.is_mixed_chunk = args.enable_mixed_chunk
        s.priority_scheduling_preemption_threshold = int(settings.get("priority_scheduling_preemption_threshold") or 0)
        s.max_running_requests = args.max_running_requests
        s.truncation_align_size = None  # deterministic inference / DSA alignment: not recorded
        # The real start-up step turns the grid into the truncation alignment.
        with recorded_grid(self._scheduler_module, self.mamba_chunk_grid):
            Scheduler.init_mamba_truncation_align(s)
        s.policy = self.policy
        # Read as call arguments of the swapped ScheduleBatch.init_new, never used.
        s.model_config = None
        s.enable_overlap = False
        s.spec_algorithm = None
        s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
        s.get_prefill_adder_class = lambda: self._make_adder
        # Preempted requests go back to the queue (the rest of _add_request_to_queue reads
        # server state a pass does not hold and decides nothing here).
        s._add_request_to_queue = lambda req, is_retracted=False: s.waiting_queue.append(req)
        return s

    def _make_adder(self, *args: Any, **kwargs: Any):
        adder = self._PrefillAdder(*args, **kwargs)
        self._adder = adder
        budget = adder.memory_budget
        # Capture the continuing chunk's budget (the recorder's ChunkOutcome.budget).
        real = budget.available_chunk_tokens

        def available_chunk_tokens(chunk_limit):
            result = real(chunk_limit)
            self._chunk_budget = result
            return result

        budget.available_chunk_tokens = available_chunk_tokens
        return adder

    def _load(self, p: Pass, *, reuse: bool = False, frees: dict[str, int] | None = None,
              waiting_now: bool = True) -> tuple[list | None, Any, Any]:
        """Real sglang state for ``p``. ``reuse``: take Reqs from the caches (then the caller must
        ``release`` what the pass admitted); without ``waiting_now`` the waiting ones are left for
        ``_calc_priority`` to take (None): a pass that returns before it never reads them."""
        ScheduleBatch = self._ScheduleBatch
        if reuse:
            running = self._reqs.running_reqs(p)
            waiting = self._reqs.waiting_reqs(p) if waiting_now else None
            tokens = self._reqs.tokens
        else:
            tokens = TokenSource(book=self.book)
            waiting = [waiting_req(tokens, w, n) for n, w in enumerate(p.waiting)]
            running = [running_req(tokens, r) for r in p.running]
        chunked = chunked_req(tokens, p.chunked) if p.chunked is not None else None
        batch = ScheduleBatch.__new__(ScheduleBatch)
        batch.__dict__.update(self._batch_defaults)  # what its generated __init__ sets (99 stores)
        batch.reqs = running
        batch.batch_is_full = p.batch_is_full_in
        if self.scheduler.enable_priority_preemption:
            self._releases = Releases({r.rid: r for r in p.released or ()}, frees)
            batch.release_req = partial(self._release, batch)
            batch.filter_batch = partial(keep_rows, batch)
        kv = p.kv
        self.req_slots.load(p.req_slots_free, kv)
        self.allocator.load(kv)
        self.tree_cache.load_pass(p)
        return waiting, batch, chunked

    # --------------------------------------------------------------- decide

    def decide(self, p: Pass, variant: str, frees: dict[str, int] | None = None) -> Decision:
        """The decision the real code makes on ``p``'s inputs under ``variant``. ``frees``: the KV
        each running request frees if preemption releases it (a closed loop's; None: the recorded counts)."""
        fixes = fixes_of(variant)
        with _LOCK:
            # sglang reads only the queue's length before calc_priority
            waiting, batch, chunked = self._load(p, reuse=True, frees=frees, waiting_now=reads_queue_early(fixes))
            s = self.scheduler
            s.waiting_queue = [None] * len(p.waiting) if waiting is None else list(waiting)
            self._unbuilt, self._built = (p if waiting is None else None), waiting
            s.chunked_req = chunked
            s.chunked_prefill_size = p.chunked_prefill_size
            s.processed_tokens_counter = p.processed_tokens or 0
            s.new_token_ratio_tracker = Ratio(p.new_token_ratio)
            self._adder = None
            self._chunk_budget = None
            self._order = None
            self._recorded_order = self.tree_cache.recorded_order = p.order
            admitted_reqs: list | None = None
            error: str | None = None
            ScheduleBatch = self._ScheduleBatch
            original_init_new = ScheduleBatch.__dict__["init_new"]
            policy_module = self._policy_module
            original_grid = policy_module.__dict__["mamba_prefill_chunk_grid"]
            original_exact_fill = policy_module.__dict__["_use_exact_chunk_fill"]
            # The context managers of installed()/applied()/recorded_grid, inlined:
            # this runs twice per pass and more on divergent ones.
            saved_config = self._config.swap_in()
            # The recorded constants first: an arm that binds one of them wins while it is on.
            saved_constants = swap_constants(self._constants)
            previous_fixes = switch_fixes(fixes)
            policy_module.mamba_prefill_chunk_grid = self._grid_lookup
            policy_module._use_exact_chunk_fill = self._exact_fill_lookup
            ScheduleBatch.init_new = self._stop_init_new
            policy_class = type(self.policy)
            if self._random:
                original_shuffle = policy_class.__dict__["_sort_randomly"]
                policy_class._sort_randomly = self._sort_randomly
            try:
                s._get_new_batch_prefill_raw(None, batch)
                admitted_reqs = []  # returned before building a batch: nothing admitted
            except AdmissionDone as done:
                admitted_reqs = done.reqs
            except Exception as exc:  # the real code raised: that is the arm's outcome
                error = error_text(exc)
            finally:
                if self._random:
                    policy_class._sort_randomly = original_shuffle
                ScheduleBatch.init_new = original_init_new
                policy_module.mamba_prefill_chunk_grid = original_grid
                policy_module._use_exact_chunk_fill = original_exact_fill
                restore_fixes(fixes, previous_fixes)
                swap_constants(saved_constants)
                self._config.swap_out(saved_config)
            decision = self._decision(batch, chunked, admitted_reqs, error)
            self._reqs.release(p, self._built, admitted_reqs if error is None else None)
            return decision

    def _decision(self, batch, chunked, admitted_reqs, error) -> Decision:
        adder = self._adder
        if admitted_reqs is None:  # raised: report what admission had reached
            admitted_reqs = list(adder.can_run_list) if adder is not None else []
        admitted = [(r.rid, int(r.extend_len)) for r in admitted_reqs]
        chunk_size = None
        if chunked is not None:
            chunk_size = next((n for rid, n in admitted if rid == chunked.rid), None)
        # As the recorder sees it: the scheduler's chunked request after the
        # pass, when it is not the one the pass started with.
        new_chunked = self.scheduler.chunked_req
        if new_chunked is chunked:
            new_chunked = None
        return Decision(
            admitted=admitted,
            chunk_budget=self._chunk_budget if chunked is not None else None,
            chunk_size=chunk_size,
            new_chunked_rid=new_chunked.rid if new_chunked is not None else None,
            # A pass that raised returns no batch: the recorder writes False.
            batch_is_full=bool(batch.batch_is_full) if error is None else False,
            over_ask=self._over_ask(admitted_reqs),
            error=error,
            queue_order=self._order,
            released=self._releases.done or None,
        )

    def _over_ask(self, admitted_reqs: list) -> int:
        """Tokens ``alloc_extend`` would be asked for beyond free + evictable."""
        if not admitted_reqs:
            return 0
        extend = sum(r.extend_len for r in admitted_reqs)
        # Paged allocation evicts for one spare page per request (alloc_paged_token_slots_extend).
        requested = extend if self.page_size == 1 else extend + len(admitted_reqs) * self.page_size
        # Admission pinned the admitted prefixes, so the evictable counts are what is left now.
        # An SWA allocator pages the extend on both sides (alloc_extend): the shorter one binds.
        full, swa = self.allocator.capacity(self.tree_cache)
        return max(0, requested - full, 0 if swa is None else requested - swa)

    # ---------------------------------------------------------------- aiter

    def decide_aiter(self, event: Aiter, variant: str) -> str:
        """The ``AttnForwardMethod`` name ``handle_attention_aiter`` picks for ``event``."""
        return aiter_method(event, variant, self._config, _LOCK)
