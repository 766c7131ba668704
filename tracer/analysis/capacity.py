"""What a trace's server could hold, from its header: one rule for every reader.

This recorder writes the scheduler's own ``max_running_requests`` and
``max_total_tokens`` (what sglang derived from the flags, or capped them to:
the mamba state cache caps the running requests); traces from before hold the
flags as given, None where unset. The request pool's size (``max_req_slots``)
and the pool layout say what was built either way.
"""

from __future__ import annotations

from schedtrace.tracer.contract.schema import Header


def request_slots(header: Header) -> int:
    """The request pool's size: recorded, else ``max_running_requests`` + 1 (sglang's sizing)."""
    return header.max_req_slots or (header.server_args.max_running_requests or 0) + 1


def max_running(header: Header) -> int:
    """The running cap (``pp_max_micro_batch_size`` with one pipeline stage):
    ``max_running_requests``, else the request pool's size."""
    return max(header.server_args.max_running_requests or request_slots(header), 1)


def micro_batch_cap(header: Header) -> int:
    """The requests one running batch may hold (``pp_max_micro_batch_size``): the setting, else
    sglang's default, the running cap over the pipeline stages (``Scheduler.__init__``)."""
    given = _positive_setting(header, "pp_max_micro_batch_size")
    return given if given is not None else max(max_running(header) // max(header.pp_size, 1), 1)


def micro_batches(header: Header) -> int:
    """The running batches the scheduler takes in turn: ``pp_size + pp_async_batch_depth`` in the
    pipeline loop (``init_pp_loop_state``), 1 without it."""
    if header.pp_size <= 1:
        return 1
    return header.pp_size + (_positive_setting(header, "pp_async_batch_depth") or 0)


def _positive_setting(header: Header, name: str) -> int | None:
    """A recorded count setting; None when unset or not a positive int."""
    value = header.settings.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def kv_tokens(header: Header) -> int | None:
    """Full-pool KV tokens: the pool layout's size, else ``max_total_tokens``; None: unknown."""
    if header.pools is not None:
        return header.pools.full_size
    return header.server_args.max_total_tokens or None
