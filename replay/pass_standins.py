"""The few sglang objects a replayed pass touches beyond its requests and pools, as rows only."""

from __future__ import annotations

from typing import Any


def keep_rows(batch: Any, reqs_to_exclude: Any = None, keep_indices: list[int] | None = None) -> None:
    """``ScheduleBatch.filter_batch`` for a batch of rows only (the replay builds no tensors)."""
    if keep_indices is None:
        excluded = reqs_to_exclude if isinstance(reqs_to_exclude, list) else [reqs_to_exclude]
        keep_indices = [i for i, r in enumerate(batch.reqs) if r not in excluded]
    batch.reqs = [batch.reqs[i] for i in keep_indices]


class Ratio:
    """``Scheduler.new_token_ratio_tracker``: only ``current`` is read."""

    __slots__ = ("current",)

    def __init__(self, current: float) -> None:
        self.current = current


class AiterBatch:
    """The three things ``handle_attention_aiter`` reads from a ForwardBatch."""

    def __init__(self, mode, seq_lens_sum: int, max_chunk_capacity: int) -> None:
        self.forward_mode = mode
        self.seq_lens_cpu = [seq_lens_sum]
        self.extend_prefix_lens_cpu = None
        self._capacity = max_chunk_capacity

    def get_max_chunk_capacity(self) -> int:
        return self._capacity


class AdmissionDone(Exception):
    """Raised in place of building the batch: admission is over."""

    def __init__(self, reqs: list) -> None:
        self.reqs = reqs


def stop_init_new(cls, reqs, *args: Any, **kwargs: Any):
    """``ScheduleBatch.init_new`` for a replayed pass: it ends admission with the requests admitted."""
    raise AdmissionDone(list(reqs))
