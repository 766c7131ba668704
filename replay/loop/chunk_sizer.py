"""The chunk size a closed-loop step gives: sglang's dynamic chunk sizer, rebuilt from the header.

With ``--enable-dynamic-chunking`` (and ``pp_size > 1``) sglang sizes a
continuing chunk by its prefilled length (``Scheduler._get_new_batch_prefill_raw``
asks ``DynamicChunkSizer.predict(chunked_req.prefix_len)``). The open loop reads
each pass's recorded size; the closed loop's chunks land where its own arm put
them, so it asks sglang's own ``ChunkSizePredictor`` with the fit the recorder
wrote (``Header.chunk_sizer``) and the recorded smoothing factor.
"""

from __future__ import annotations

from typing import Any

from schedtrace.tracer.contract.schema import ChunkedReq, ChunkSizerFit, Header

SMOOTH_FACTOR = "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"


class ChunkSizes:
    """``size(chunked)``: the chunked_prefill_size a pass with ``chunked`` at entry runs with."""

    def __init__(self, header: Header, static_size: int | None) -> None:
        self.static_size = static_size
        self._fit = header.chunk_sizer
        self._base = header.server_args.chunked_prefill_size
        self._max_prefill = header.server_args.max_prefill_tokens
        self._page_size = header.server_args.page_size
        self._smooth = header.settings.get(SMOOTH_FACTOR)
        self._predictor = _predictor(self._fit) if self._fit is not None and self._base else None
        self._sizes: dict[int, int | None] = {}  # prefilled length -> predicted size (a pure function)

    @property
    def dynamic(self) -> bool:
        return self._predictor is not None

    def size(self, chunked: ChunkedReq | None) -> int | None:
        if self._predictor is None:
            return self.static_size
        if chunked is None:
            return self._base  # the sizer sizes only a continuing chunk
        history = chunked.prefix_len
        if history not in self._sizes:
            self._sizes[history] = self._predict(history)
        predicted = self._sizes[history]
        return self._base if predicted is None else predicted  # None: sglang keeps the static size

    def _predict(self, history: int) -> int | None:
        from sglang.srt.environ import envs  # sglang loads only when a loop runs (the CLI starts without it)

        assert self._predictor is not None and self._fit is not None and self._base
        kwargs = dict(history_len=history, base_chunk_size=self._base, page_size=self._page_size,
                      context_len=self._fit.context_len, max_chunk_size=self._max_prefill)
        if self._smooth is None:  # an older trace: sglang's default
            return self._predictor.predict_next_chunk_size(**kwargs)
        with envs.SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR.override(self._smooth):
            return self._predictor.predict_next_chunk_size(**kwargs)


def _predictor(fit: ChunkSizerFit) -> Any:
    from sglang.srt.managers.scheduler_components.dynamic_chunk_sizer import ChunkSizePredictor

    predictor = ChunkSizePredictor()
    predictor.quadratic_coeff_a = fit.quadratic
    predictor.linear_coeff_b = fit.linear
    predictor.constant_coeff_c = fit.constant
    predictor.target_latency = fit.target_latency_ms
    predictor.is_ready = True
    return predictor
