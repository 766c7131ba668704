"""The order sglang checks the waiting queue in: ``SchedulePolicy.calc_priority``'s.

``admission.head_check`` checks requests in this order. A trace whose
recorder records it (``Pass.order``) gives it exactly, for every policy; an
older trace gets a mirror of the policies that need no tree (fcfs, lof,
priorities, lpm without in-batch sharing), and an estimate note for the rest.
Pure: no sglang import. tests/test_stall_rule.py holds both to the real policy.
"""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.contract.order import OrderError, in_order
from schedtrace.tracer.contract.schema import Pass, WaitingReq

WAITING_QUEUE_PREFIX_MATCH_MAX: Final = 128  # sglang's: past this many waiting, no prefix matching


def admission_order(p: Pass, policy: str, priority: bool, *, recorded: bool = False,
                    low_first: bool = False) -> tuple[list[WaitingReq], str | None]:
    """``calc_priority``'s order of ``p.waiting`` under ``policy``, and why it is an estimate (None: exact).

    ``recorded``: the trace records the order (``Pass.order``), which is then the answer."""
    waiting = p.waiting
    if recorded:
        try:
            return in_order(waiting, p.order), None
        except OrderError as exc:
            return list(waiting), f"the recorded order is damaged ({exc})"
    if priority and policy in ("fcfs", "lof"):
        if any(w.priority is None for w in waiting):
            return list(waiting), "a request without priority under priority scheduling"
        # priority_sign: -1 (higher values first) unless low values go first; then queue order
        # (fcfs) or longest output
        sign = 1 if low_first else -1
        second = (lambda w: 0) if policy == "fcfs" else (lambda w: -w.max_new_tokens)
        return sorted(waiting, key=lambda w: (sign * w.priority, second(w))), None
    if policy in ("lpm", "hrrn") and len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
        return list(waiting), None  # prefix matching off for a long queue: fcfs
    if policy == "fcfs":
        return list(waiting), None
    if policy == "lof":
        return sorted(waiting, key=lambda w: -w.max_new_tokens), None
    if policy == "lpm":
        # num_matched_prefix_tokens; without recorded prefix ids no two requests share one in-batch
        return sorted(waiting, key=lambda w: -min(w.prefix_len, max(w.input_len + w.output_len - 1, 0))), None
    return list(waiting), f"{policy} queue order not mirrored"
