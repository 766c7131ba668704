"""The new-token ratio a closed loop evolves, as sglang's ``NewTokenRatioTracker`` does.

Admission reserves ``ratio × max_new_tokens`` for each running request. The ratio starts
at its init, decays by a fixed step every decode step, jumps to an estimate over the
requests kept after a retraction, and is reset when the scheduler idles. The recorded
server's settings (``Header.settings``, sglang's defaults where a trace has none) give
its constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from schedtrace.tracer.contract.schema import Header

# sglang 0.5.23's defaults (sglang/srt/environ.py), for traces that recorded no settings.
_DEFAULTS = {
    "SGLANG_INIT_NEW_TOKEN_RATIO": 0.7,
    "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": 0.14,
    "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": 600,
    "SGLANG_RETRACT_DECODE_STEPS": 20,
}


class Decoding(Protocol):
    output_len: int
    max_new_tokens: int


@dataclass(frozen=True)
class RatioRule:
    init: float
    min: float
    decay: float
    retract_decode_steps: int

    @classmethod
    def of(cls, header: Header) -> RatioRule:
        settings = {**_DEFAULTS, **{k: v for k, v in header.settings.items() if k in _DEFAULTS and v is not None}}
        init = min(float(settings["SGLANG_INIT_NEW_TOKEN_RATIO"]) * header.server_args.schedule_conservativeness, 1.0)
        floor = min(init * float(settings["SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR"]), 1.0)
        steps = max(int(settings["SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"]), 1)
        return cls(init, floor, (init - floor) / steps, int(settings["SGLANG_RETRACT_DECODE_STEPS"]))

    def decayed(self, ratio: float) -> float:
        """After a decode step that retracted nothing (``decay_step``)."""
        return max(ratio - self.decay, self.min)

    def after_retract(self, kept: Sequence[Decoding]) -> float:
        """After a retraction: ``estimate_new_token_ratio_after_retract`` over the requests kept."""
        decoded = sum(r.output_len for r in kept) + self.retract_decode_steps * len(kept)
        return min(1.0, decoded / (sum(r.max_new_tokens for r in kept) + 1))
