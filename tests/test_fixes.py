"""The four scheduler fixes against the real sglang code.

Each fix gets a reproduction in the style of the PR's unit tests: stock shows
the bug, the fix alone and ``fixed`` remove it, and after the block the stock
code objects are back (every edited function of a fix). Real sglang objects throughout (allocator, radix cache,
Req, PrefillAdder, Scheduler method, attention handler); stand-ins only for
scheduler collaborators the method touches but a CPU test cannot build.
"""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import pytest
import torch

from schedtrace.arms import variants
from schedtrace.arms.fixes import FIX_NAMES, FIXES
from schedtrace.arms.patching import EditStatus, Fix, SourceEdit, check_one_edit_per_function, prepare
from schedtrace.tracer.contract.errors import FixMismatchError, UsageError

# The one heavy import: everything below is the real sglang 0.5.23 code.
from sglang.srt.managers import schedule_policy, scheduler as scheduler_module
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.prefill_budget import PrefillBudget
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
    enable_breakable_cuda_graph,
)
from sglang.srt.models.deepseek_common import attention_backend_handler as aiter_module
from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
    AttnForwardMethod,
)
from sglang.srt.runtime_context import get_context
from sglang.srt.sampling.sampling_params import SamplingParams

PAGE = 16
ALL_FIXES = ["fixed", *FIX_NAMES]


@pytest.fixture(scope="module", autouse=True)
def default_policy_config():
    """Publish a real dummy config with the default (non-SPF) policy."""
    override = get_context().override_server_args(schedule_policy="fcfs", pp_max_micro_batch_size=16)
    override.install()
    yield
    override.restore()


@pytest.fixture(autouse=True)
def back_to_stock():
    yield
    variants.set_active(frozenset())


def variants_fixing(fix: str) -> list[str]:
    return [fix, "fixed"]


def kv_pool(pages: int, page_size: int = PAGE):
    allocator = PagedTokenToKVPoolAllocator(
        size=pages * page_size,
        page_size=page_size,
        dtype=torch.float32,
        device="cpu",
        kvcache=None,
        need_sort=False,
    )
    tree = RadixCache.create_simulated(disable=True, mock_allocator=allocator, page_size=page_size)
    return allocator, tree


def make_req(rid: str, tree, input_len: int, max_new_tokens: int = 8, ignore_eos: bool = False) -> Req:
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    params.normalize(None)
    req = Req(rid, "", array("q", range(input_len)), params)
    req.init_next_round_input(tree)
    return req


def alloc_extend(allocator, extend: int):
    """The allocation a fresh chunk of ``extend`` tokens makes in the scheduler."""
    zero = torch.tensor([0])
    seq = torch.tensor([extend])
    return allocator.alloc_extend(zero, zero, seq, seq, torch.tensor([-1]), extend)


# ------------------------------------------------------------------ chunk-cap


def starved_budget(free_pages: int, reserved_for_decode: int):
    allocator, tree = kv_pool(pages=16)
    allocator.alloc((16 - free_pages) * PAGE)  # held by running requests
    budget = allocator.create_prefill_budget(tree)
    assert type(budget) is PrefillBudget
    budget.total_offset += reserved_for_decode
    return allocator, budget


def test_chunk_cap_stock_over_asks_with_no_free_kv():
    allocator, budget = starved_budget(free_pages=0, reserved_for_decode=100)
    with variants.applied("stock"):
        chunk = budget.available_chunk_tokens(256)
    assert chunk == 256  # the bug: sized by the token budget alone
    assert alloc_extend(allocator, chunk) is None  # and alloc_extend fails


@pytest.mark.parametrize("variant", variants_fixing("chunk-cap"))
def test_chunk_cap_defers_without_free_kv(variant):
    _, budget = starved_budget(free_pages=0, reserved_for_decode=100)
    with variants.applied(variant):
        assert budget.available_chunk_tokens(256) is None


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("chunk-cap")])
def test_chunk_cap_leaves_the_page_alloc_extend_over_asks(variant):
    allocator, budget = starved_budget(free_pages=4, reserved_for_decode=200)
    with variants.applied(variant):
        chunk = budget.available_chunk_tokens(256)
    if variant == "stock":
        assert chunk == 256 and alloc_extend(allocator, chunk) is None
    else:
        assert chunk == 4 * PAGE - PAGE  # the free KV less one page
        assert alloc_extend(allocator, chunk) is not None


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("chunk-cap")])
def test_chunk_cap_with_budget_left(variant):
    _, budget = starved_budget(free_pages=8, reserved_for_decode=0)
    with variants.applied(variant):
        chunk = budget.available_chunk_tokens(256)
    assert chunk == (128 if variant == "stock" else 128 - PAGE)


# ------------------------------------------------------------------ one-chunk


def adder_with_chunk_budget(tree, allocator, chunk: int = 256) -> PrefillAdder:
    return PrefillAdder(PAGE, tree, allocator, ScheduleBatch(reqs=[]), 0.5, 4096, chunk)


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("one-chunk")])
def test_default_policy_rejects_second_unfinished_chunk(variant):
    allocator, tree = kv_pool(pages=128)
    second = make_req("second", tree, input_len=600)
    adder = adder_with_chunk_budget(tree, allocator)
    with variants.applied(variant):
        result = adder.add_one_req(second, has_chunked_req=True, truncation_align_size=None)
    if variant == "stock":
        assert adder.new_chunked_req is second  # a second unfinished chunk
    else:
        assert result is AddReqResult.OTHER
        assert adder.new_chunked_req is None and adder.can_run_list == []


def edited_functions(fix: str) -> list:
    return [edit.function for edit in variants.prepared(fix).edits]


def test_one_chunk_edits_both_admission_paths():
    functions = edited_functions("one-chunk")
    assert functions == [PrefillAdder._select_prefill_admission, PrefillAdder.add_one_req]


def ignore_eos_adder(chunk: int = 256):
    """A real adder on the ignore_eos path: radix cache off, ignore_eos request."""
    allocator, tree = kv_pool(pages=512)
    assert tree.disable  # what add_one_req checks to take the ignore_eos path
    return tree, PrefillAdder(PAGE, tree, allocator, ScheduleBatch(reqs=[]), 0.5, 4096, chunk)


@pytest.mark.parametrize("input_len", [257, 600])  # one token over the chunk budget, and far over
@pytest.mark.parametrize("variant", ["stock", *variants_fixing("one-chunk")])
def test_ignore_eos_path_rejects_second_unfinished_chunk(variant, input_len):
    tree, adder = ignore_eos_adder(chunk=256)
    second = make_req("second", tree, input_len=input_len, ignore_eos=True)
    with variants.applied(variant):
        result = adder.add_one_req(second, has_chunked_req=True, truncation_align_size=None)
    if variant == "stock":
        # add_one_req_ignore_eos chunked it: a second unfinished chunk.
        assert adder.new_chunked_req is second and second.extend_end == 256
    else:
        assert result is AddReqResult.OTHER
        assert adder.new_chunked_req is None and adder.can_run_list == []


@pytest.mark.parametrize("variant", ["stock", "one-chunk"])
def test_ignore_eos_guard_blocks_only_a_second_chunk(variant):
    """The guard is exactly the path's chunking condition: a request that fits
    the chunk budget whole is still admitted beside an unfinished chunk, and
    with no chunk in flight a long one is still chunked."""
    tree, adder = ignore_eos_adder(chunk=256)
    whole = make_req("whole", tree, input_len=256, ignore_eos=True)  # == rem_chunk_tokens: the last chunk
    with variants.applied(variant):
        adder.add_one_req(whole, has_chunked_req=True, truncation_align_size=None)
    assert adder.can_run_list == [whole] and adder.new_chunked_req is None
    assert whole.extend_end == 256

    tree, adder = ignore_eos_adder(chunk=256)
    long = make_req("long", tree, input_len=600, ignore_eos=True)
    with variants.applied(variant):
        adder.add_one_req(long, has_chunked_req=False, truncation_align_size=None)
    assert adder.new_chunked_req is long


def test_one_chunk_revert_restores_both_code_objects():
    functions = edited_functions("one-chunk")
    originals = [function.__code__ for function in functions]
    with variants.applied("one-chunk"):
        assert variants.prepared("one-chunk").is_applied
        assert all(f.__code__ is not code for f, code in zip(functions, originals))
    assert [function.__code__ for function in functions] == originals
    assert all(f.__code__ is code for f, code in zip(functions, originals))


class _ReachedBatchInit(Exception):
    """The pass got past admission to building the batch: far enough."""


class _NoGrammars:
    def has_waiting_grammars(self) -> bool:
        return False


class _NoBeams:
    def pending_member_rows(self, batch) -> int:
        return 0


class StubScheduler(scheduler_module.Scheduler):
    """The real Scheduler methods on a hand-set state (no model, no workers)."""

    @property
    def model_config(self):
        raise _ReachedBatchInit


def stub_scheduler(tree, allocator, waiting, running, chunked_req=None, chunk=256):
    s = StubScheduler.__new__(StubScheduler)
    s.__dict__.update(
        grammar_manager=_NoGrammars(),
        beam_coordinator=_NoBeams(),
        enable_priority_preemption=False,
        is_hybrid_swa=False,
        waiting_queue=list(waiting),
        chunked_req=chunked_req,
        running_batch=running,
        min_free_slots_delayer=None,
        req_to_token_pool=ReqToTokenPool(
            size=16, max_context_len=4096, device="cpu", enable_memory_saver=False
        ),
        policy=SchedulePolicy("fcfs", tree, False, False, False),
        processed_tokens_counter=0,
        chunked_prefill_size=chunk,
        dynamic_chunk_sizer=None,
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object())),
        page_size=PAGE,
        tree_cache=tree,
        token_to_kv_pool_allocator=allocator,
        new_token_ratio_tracker=SimpleNamespace(current=0.5),
        max_prefill_tokens=4096,
        is_mixed_chunk=False,
        priority_scheduling_preemption_threshold=0,
        max_prefill_bs=0,
        max_running_requests=12,
        dllm_config=None,
        enable_lora=False,
        enable_hicache_storage=False,
        enable_lmcache=False,
        truncation_align_size=None,
    )
    return s


def run_pass(s, running):
    try:
        return s._get_new_batch_prefill_raw(None, running)
    except _ReachedBatchInit:
        return "batch"


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("one-chunk")])
def test_second_chunk_hits_the_scheduler_assert(variant):
    """A continuing chunk that leaves chunk budget, then a long new request.

    The continuation is cut short by the DCP mamba checkpoint grid, the path
    the PR's hybrid model takes. DCP needs several ranks, so only that
    predicate is forced here; the cut itself is the real floor_chunked_tokens.
    """
    allocator, tree = kv_pool(pages=20000, page_size=1)
    first = make_req("first", tree, input_len=3000)
    second = make_req("second", tree, input_len=3000)
    running = ScheduleBatch(reqs=[])
    s = stub_scheduler(tree, allocator, [second], running, chunked_req=first, chunk=1000)
    s.page_size = 1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(schedule_policy, "mamba_prefill_chunk_grid", lambda: 64)
        with variants.applied(variant):
            if variant == "stock":
                with pytest.raises(AssertionError) as caught:
                    run_pass(s, running)
                assert "assert self.chunked_req is None" in str(caught.traceback[-1].statement)
                return
            assert run_pass(s, running) == "batch"
    assert s.chunked_req is first  # still the one tracked
    assert s.waiting_queue == [second]


# ---------------------------------------------------------------------- latch


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("latch")])
def test_latched_running_batch_still_admits(variant):
    allocator, tree = kv_pool(pages=256)
    decoding = make_req("decoding", tree, input_len=32)
    waiting = make_req("waiting", tree, input_len=64)
    running = ScheduleBatch(reqs=[decoding], batch_is_full=True)  # latched earlier
    s = stub_scheduler(tree, allocator, [waiting], running)
    with variants.applied(variant):
        outcome = run_pass(s, running)
    if variant == "stock":
        assert outcome == (None, running)  # stalls with KV free
        assert running.batch_is_full
    else:
        assert outcome == "batch"  # the waiting request is admitted
        assert s.waiting_queue == []


# ---------------------------------------------------------------------- aiter


class OverCapacityExtend:
    """An extend whose sequences exceed the one-shot MHA capacity."""

    forward_mode = ForwardMode.EXTEND
    extend_prefix_lens_cpu = [0]
    seq_lens_cpu = [9000]

    def get_max_chunk_capacity(self) -> int:
        return 4096


@pytest.mark.parametrize("variant", ["stock", *variants_fixing("aiter")])
def test_over_capacity_extend_stays_chunked_in_graph_context(variant):
    with variants.applied(variant), enable_breakable_cuda_graph():
        method = aiter_module.handle_attention_aiter(object(), OverCapacityExtend())
    expected = AttnForwardMethod.MHA if variant == "stock" else AttnForwardMethod.MHA_CHUNKED_KV
    assert method is expected
    # Outside graph context both agree already.
    with variants.applied(variant):
        assert aiter_module.handle_attention_aiter(object(), OverCapacityExtend()) is (
            AttnForwardMethod.MHA_CHUNKED_KV
        )


# ------------------------------------------------------------ the machinery


def all_code() -> dict[tuple[str, str], object]:
    """The current code object of every function any fix edits."""
    return {
        (fix, edit.edit.target): edit.function.__code__
        for fix in FIX_NAMES
        for edit in variants.prepared(fix).edits
    }


def test_revert_restores_the_exact_code_objects():
    originals = all_code()
    for _ in range(3):
        with variants.applied("fixed"):
            assert all(all_code()[key] is not code for key, code in originals.items())
            with variants.applied("stock"):  # nesting: stock inside fixed
                assert all(all_code()[key] is code for key, code in originals.items())
        assert all(all_code()[key] is code for key, code in originals.items())


def test_each_fix_alone_touches_only_its_functions():
    originals = all_code()
    for fix in FIX_NAMES:
        with variants.applied(fix):
            for (owner, target), code in all_code().items():
                assert (code is not originals[owner, target]) == (owner == fix), target
            for other in FIX_NAMES:
                assert variants.prepared(other).is_applied == (other == fix)


def test_mismatch_names_function_fix_and_version():
    (edit,) = FIXES["chunk-cap"].edits
    fix = Fix("chunk-cap", (SourceEdit("sglang.srt.mem_cache.prefill_budget:PrefillBudget.fit_chunk", edit.old, edit.new),))
    with pytest.raises(FixMismatchError) as caught:
        prepare(fix)
    message = str(caught.value)
    assert "chunk-cap" in message and "PrefillBudget.fit_chunk" in message
    assert "0.5.23" in message


def test_mismatch_in_a_later_edit_names_that_function():
    first, second = FIXES["one-chunk"].edits
    wrong_place = SourceEdit("sglang.srt.managers.schedule_policy:PrefillAdder.add_one_req_ignore_eos", second.old, second.new)
    with pytest.raises(FixMismatchError) as caught:
        prepare(Fix("one-chunk", (first, wrong_place)))
    assert caught.value.function == wrong_place.target
    assert caught.value.fix == "one-chunk"
    assert PrefillAdder._select_prefill_admission.__code__ is variants.prepared("one-chunk").edits[0].original


def test_already_present_is_reported_not_patched(caplog):
    (chunk_cap,) = FIXES["chunk-cap"].edits
    # An edit whose "new" code is what sglang already has.
    present = SourceEdit(
        target=chunk_cap.target,
        old="return available if available > 0 else None",
        new=chunk_cap.old,
    )
    prepared = prepare(Fix("chunk-cap", (present,)))
    assert prepared.status is EditStatus.ALREADY_PRESENT
    before = prepared.edits[0].function.__code__
    prepared.apply()
    assert prepared.edits[0].function.__code__ is before


def test_fix_is_already_present_only_if_every_edit_is():
    (chunk_cap,) = FIXES["chunk-cap"].edits
    present = SourceEdit(chunk_cap.target, "return available if available > 0 else None", chunk_cap.old)
    (latch,) = FIXES["latch"].edits
    partly = prepare(Fix("mixed", (present, latch)))
    assert [e.status for e in partly.edits] == [EditStatus.ALREADY_PRESENT, EditStatus.PATCHABLE]
    assert partly.status is EditStatus.PATCHABLE
    try:
        partly.apply()  # the present edit patches to itself, the other applies
        assert partly.edits[0].function.__code__ is partly.edits[0].original
        assert partly.edits[1].function.__code__ is partly.edits[1].patched
    finally:
        partly.revert()
    assert partly.edits[1].function.__code__ is partly.edits[1].original


def test_two_edits_of_one_function_are_refused():
    (latch,) = FIXES["latch"].edits
    with pytest.raises(ValueError, match="_get_new_batch_prefill_raw"):
        check_one_edit_per_function([*FIXES.values(), Fix("again", (latch,))])
    with pytest.raises(ValueError, match="_get_new_batch_prefill_raw"):
        check_one_edit_per_function([Fix("twice", (latch, latch))])


def test_new_snippets_are_absent_from_stock():
    for fix in FIX_NAMES:
        assert variants.prepared(fix).status is EditStatus.PATCHABLE
        assert all(edit.status is EditStatus.PATCHABLE for edit in variants.prepared(fix).edits)


@pytest.mark.parametrize("bad", ["chunkcap", "stock,nope", ""])
def test_unknown_variant_lists_valid_names(bad):
    with pytest.raises(UsageError) as caught:
        variants.parse_variant(bad)
    assert "chunk-cap" in str(caught.value) and "fixed" in str(caught.value)


def test_parse_variants():
    assert variants.parse_variant("stock") == frozenset()
    assert variants.parse_variant("fixed") == frozenset(FIX_NAMES)
    assert variants.parse_variant("latch, aiter") == {"latch", "aiter"}
    assert variants.variant_label(variants.parse_variant("aiter,latch")) == "latch,aiter"


def test_install_fixes_from_env():
    assert variants.install_fixes_from_env({}) == {}
    statuses = variants.install_fixes_from_env({"SCHEDTRACE_FIXES": "latch,aiter"})
    assert set(statuses) == {"latch", "aiter"}
    assert variants.active_fixes() == {"latch", "aiter"}
    variants.install_fixes_from_env({"SCHEDTRACE_FIXES": "all"})
    assert variants.active_fixes() == frozenset(FIX_NAMES)
    with pytest.raises(UsageError):
        variants.install_fixes_from_env({"SCHEDTRACE_FIXES": "bogus"})
