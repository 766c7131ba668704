"""The allocator hooks: one ``Alloc`` per outermost KV allocation, the mamba state slots by tally.

Each factory takes the ``Recorder`` and the ``AllocNesting`` its hooks share
and returns one AROUND hook; ``alloc_hooks`` pairs them with the targets
(``targets.ALLOC_TARGETS``, ``MAMBA_ROWS_TARGET``). They share one flag:
composite allocators (SWA, paged) call their sub-allocators, and only the
outermost call is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedtrace.tracer.recorder.capture import SlotTally
from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.recorder.rows import MAMBA_ALLOC
from schedtrace.tracer.recorder.targets import ALLOC_TARGETS, ALLOCATOR_METHODS, MAMBA_ROWS_TARGET, Hook


def _arg(index: int, name: str) -> Callable[[tuple, dict], Any]:
    """The reader of one call argument, passed by position or by name (one frame per read)."""
    return lambda args, kwargs: args[index] if len(args) > index else kwargs[name]


_extend_num_tokens = _arg(5, "extend_num_tokens")
_seq_lens = _arg(0, "seq_lens")

# How many tokens (or requests, for decode) each KV allocator method is asked for.
# (``MambaSlotAllocator.alloc``'s state slots: its hook reads ``need_size`` itself.)
ALLOC_REQUESTED: dict[str, Callable[[tuple, dict], int]] = {
    "alloc": _arg(0, "need_size"),
    "alloc_extend": _extend_num_tokens,
    "alloc_decode": lambda a, k: len(_seq_lens(a, k)),
    "alloc_extend_swa_tail": _extend_num_tokens,
}


def alloc_op(cls: str, method: str) -> str:
    """The ``Alloc.op`` an allocator method is written as: its name; mamba slots have their own."""
    return MAMBA_ALLOC if cls.startswith("mamba.") else method


class AllocNesting:
    """What one recorder's allocator hooks share (slots: a flag read costs one attribute)."""

    __slots__ = ("in_alloc", "rows_tally")

    def __init__(self) -> None:
        self.in_alloc = False  # inside an allocator hook: composite allocators call their sub-allocators
        self.rows_tally: SlotTally | None = None  # a request-row binding outside a pass: its slots' tally


def kv_alloc_hook(rec: Recorder, nest: AllocNesting, op: str) -> Hook:
    """A KV allocator method: one ``Alloc`` per outermost call, what it asked and whether it got it."""
    hook_failed, on_alloc = rec.hook_failed, rec.on_alloc
    requested_of = ALLOC_REQUESTED[op]

    def hook(original, allocator, *args, **kwargs):
        if nest.in_alloc:
            return original(allocator, *args, **kwargs)
        try:
            requested = requested_of(args, kwargs)
            available = allocator.available_size()
        except Exception as exc:
            hook_failed(op, exc)
            return original(allocator, *args, **kwargs)
        nest.in_alloc = True
        try:
            result = original(allocator, *args, **kwargs)
        finally:
            nest.in_alloc = False
        try:
            on_alloc(op, requested, available, result is not None)
        except Exception as exc:
            hook_failed(op, exc)
        return result

    return hook


def mamba_alloc_hook(rec: Recorder, nest: AllocNesting) -> Hook:
    """``MambaSlotAllocator.alloc``: its state slots counted into a tally (``capture.SlotTally``).

    One record for many: the pass's tally, opened at its first slot; outside a
    pass a row binding's, else the call's own. It calls no other allocator.
    """
    hook_failed, open_slots, close_slots, slot_refused = rec.hook_failed, rec.open_slots, rec.close_slots, rec.slot_refused

    def hook(original, allocator, *args, **kwargs):
        if nest.in_alloc:
            return original(allocator, *args, **kwargs)
        cap = rec.capture
        tally = nest.rows_tally or (cap.slots if cap is not None else None)
        alone = False
        try:
            if tally is None:
                alone = cap is None
                tally = open_slots(allocator.free_slots)
            # ``alloc(need_size)``, read inline: a pass asks for a slot per request.
            tally.asked += args[0] if args else kwargs["need_size"]
        except Exception as exc:
            hook_failed(MAMBA_ALLOC, exc)
            return original(allocator, *args, **kwargs)
        result = original(allocator, *args, **kwargs)
        if result is None or alone:
            try:
                if result is None:
                    slot_refused(tally)
                if alone:
                    close_slots(tally)
            except Exception as exc:
                hook_failed(MAMBA_ALLOC, exc)
        return result

    return hook


def mamba_rows_hook(rec: Recorder, nest: AllocNesting) -> Hook:
    """``HybridReqToTokenPool.alloc``: a state slot per new request of the batch, one call each.

    In a pass they go into the pass's tally; outside one, the binding is one
    record of its own (``nest.rows_tally`` while it runs).
    """
    hook_failed, open_slots, close_slots = rec.hook_failed, rec.open_slots, rec.close_slots

    def hook(original, req_pool, *args, **kwargs):
        if nest.in_alloc or nest.rows_tally is not None or rec.capture is not None:
            return original(req_pool, *args, **kwargs)
        try:
            tally = nest.rows_tally = open_slots(req_pool.mamba_allocator.free_slots)
        except Exception as exc:
            hook_failed(MAMBA_ALLOC, exc)
            return original(req_pool, *args, **kwargs)
        try:
            return original(req_pool, *args, **kwargs)  # "Not enough space for mamba cache" raises here
        finally:
            nest.rows_tally = None
            if tally.asked:
                try:
                    close_slots(tally)
                except Exception as exc:
                    hook_failed(MAMBA_ALLOC, exc)

    return hook


def allocator_hook(rec: Recorder, nest: AllocNesting, cls: str, method: str) -> Hook:
    """The hook of one ``ALLOCATOR_METHODS`` entry: the mamba slots' or a KV method's."""
    op = alloc_op(cls, method)
    return mamba_alloc_hook(rec, nest) if op == MAMBA_ALLOC else kv_alloc_hook(rec, nest, op)


def alloc_hooks(rec: Recorder) -> list[tuple[str, Hook]]:
    """(target, hook) for every allocator method and the mamba request-row binding, sharing one ``AllocNesting``."""
    nest = AllocNesting()
    return [
        *[(target, allocator_hook(rec, nest, cls, method)) for target, (cls, method) in zip(ALLOC_TARGETS, ALLOCATOR_METHODS)],
        (MAMBA_ROWS_TARGET, mamba_rows_hook(rec, nest)),
    ]
