"""The hooks around the passes: the scheduler's life, requests arriving and ending, the aiter path.

Each factory takes the ``Recorder`` and returns one AROUND hook; the table in
``hooks`` names the target of each.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from schedtrace.tracer.contract.schema import Aiter
from schedtrace.tracer.recorder.lifecycle import Recorder
from schedtrace.tracer.recorder.targets import AITER_MODULE, Hook

logger = logging.getLogger(__name__)


def init_hook(rec: Recorder) -> Hook:
    """The scheduler's ``__init__``: attach the recorder to it."""
    hook_failed = rec.hook_failed

    def hook(original, scheduler, *args, **kwargs):
        result = original(scheduler, *args, **kwargs)
        try:
            rec.attach(scheduler)
            point_aiter_registry_at_hook()
            rec.close_at_exit()
        except Exception as exc:
            hook_failed("scheduler_init", exc)
        return result

    return hook


def event_loop_hook(rec: Recorder) -> Hook:
    """The event loop ended: close the trace."""
    def hook(original, scheduler, *args, **kwargs):
        try:
            return original(scheduler, *args, **kwargs)
        finally:
            try:
                rec.close()
            except Exception as exc:
                logger.warning("schedtrace: closing the trace failed: %r", exc)

    return hook


def add_to_queue_hook(rec: Recorder) -> Hook:
    """A request arrived, or came back retracted."""
    hook_failed = rec.hook_failed

    def hook(original, scheduler, req, *args, **kwargs):
        result = original(scheduler, req, *args, **kwargs)
        try:
            rec.attach(scheduler)
            is_retracted = kwargs["is_retracted"] if "is_retracted" in kwargs else (args[0] if args else False)
            rec.on_arrival(req, bool(is_retracted))
        except Exception as exc:
            hook_failed("arrival", exc)
        return result

    return hook


def stream_output_hook(rec: Recorder) -> Hook:
    """Requests whose finish is streamed out."""
    hook_failed = rec.hook_failed

    def hook(original, streamer, reqs, *args, **kwargs):
        try:
            finishing = [r for r in reqs if r.finished_reason is not None and not r.finished_output]
        except Exception as exc:
            hook_failed("finish", exc)
            return original(streamer, reqs, *args, **kwargs)
        result = original(streamer, reqs, *args, **kwargs)
        if finishing:
            try:
                for req in finishing:
                    if req.finished_output:
                        rec.on_finish(req)
            except Exception as exc:
                hook_failed("finish", exc)
        return result

    return hook


def send_abort_output_hook(rec: Recorder) -> Hook:
    """A request sglang aborts, ending it."""
    hook_failed = rec.hook_failed

    def hook(original, scheduler, abort_req, req, *args, **kwargs):
        result = original(scheduler, abort_req, req, *args, **kwargs)
        try:
            rec.on_finish(req, "abort")
        except Exception as exc:
            hook_failed("finish", exc)
        return result

    return hook


def abort_request_hook(rec: Recorder) -> Hook:
    """A client's abort reaching the scheduler."""
    hook_failed = rec.hook_failed

    def hook(original, scheduler, recv_req, *args, **kwargs):
        try:
            rid = recv_req.rid if not getattr(recv_req, "abort_all", False) else "*"
            rec.on_abort(str(rid))
        except Exception as exc:
            hook_failed("abort", exc)
        return original(scheduler, recv_req, *args, **kwargs)

    return hook


def aiter_hook(rec: Recorder) -> Hook:
    """``handle_attention_aiter``: its inputs and the path it chose."""
    hook_failed = rec.hook_failed

    def hook(original, attn, forward_batch, *args, **kwargs):
        method = original(attn, forward_batch, *args, **kwargs)
        try:
            rec.on_aiter(aiter_record(rec.now(), forward_batch, method))
        except Exception as exc:
            hook_failed("aiter", exc)
        return method

    return hook


def aiter_record(t_ns: int, forward_batch: Any, method: Any) -> Aiter:
    """The inputs ``handle_attention_aiter`` decided on, and what it chose."""
    import sglang.srt.models.deepseek_common.attention_backend_handler as handler

    seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
    seq_lens_sum = int(sum(seq_lens_cpu)) if seq_lens_cpu is not None else int(getattr(forward_batch, "seq_lens_sum", 0) or 0)
    return Aiter(
        t_ns,
        getattr(forward_batch.forward_mode, "name", str(forward_batch.forward_mode)),
        seq_lens_sum,
        int(forward_batch.get_max_chunk_capacity()),
        bool(handler.is_in_tc_piecewise_cuda_graph()),
        bool(handler.is_in_breakable_cuda_graph()),
        getattr(method, "name", str(method)),
    )


def point_aiter_registry_at_hook() -> None:
    """The attention registry captured ``handle_attention_aiter`` at import: point it at the wrapper."""
    handler = sys.modules.get(AITER_MODULE)
    if handler is None:
        return
    wrapped = handler.handle_attention_aiter
    registry = handler.AttentionBackendRegistry._handlers
    for name, fn in list(registry.items()):
        if fn is not wrapped and fn is getattr(wrapped, "__wrapped__", None):
            registry[name] = wrapped
