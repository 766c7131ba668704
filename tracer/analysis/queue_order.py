"""The order sglang checks the waiting queue in: ``SchedulePolicy.calc_priority``, mirrored.

``admission.head_check`` checks requests in this order. Pure: no sglang import.
tests/test_stall_rule.py holds it to the real policy.
"""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.contract.schema import WaitingReq

WAITING_QUEUE_PREFIX_MATCH_MAX: Final = 128  # sglang's: past this many waiting, no prefix matching


def admission_order(waiting: list[WaitingReq], policy: str, priority: bool) -> tuple[list[WaitingReq], str | None]:
    """``calc_priority``'s order under ``policy``, and why it is an estimate (None: exact)."""
    if priority and policy in ("fcfs", "lof"):
        if any(w.priority is None for w in waiting):
            return list(waiting), "a request without priority under priority scheduling"
        # priority_sign -1: higher values first; then queue order (fcfs) or longest output
        second = (lambda w: 0) if policy == "fcfs" else (lambda w: -w.max_new_tokens)
        return sorted(waiting, key=lambda w: (-w.priority, second(w))), None
    if policy in ("lpm", "hrrn") and len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
        return list(waiting), None  # prefix matching off for a long queue: fcfs
    if policy == "fcfs":
        return list(waiting), None
    if policy == "lof":
        return sorted(waiting, key=lambda w: -w.max_new_tokens), None
    if policy == "lpm":
        # num_matched_prefix_tokens; replay's distinct token ids never share an in-batch prefix
        return sorted(waiting, key=lambda w: -min(w.prefix_len, max(w.input_len + w.output_len - 1, 0))), None
    return list(waiting), f"{policy} queue order not mirrored"
