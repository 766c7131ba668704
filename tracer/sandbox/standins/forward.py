"""The model forward stand-in: deterministic next tokens, real everything else.

Replaces ``ModelRunner._forward_raw`` for families whose real forward cannot
run on CPU here (gpt-oss: the torch-native backend has no attention sinks;
DP attention: an idle rank's empty batch). It keeps the deferred mamba
copy-on-write/clear the real forward runs first, so the mamba pool evolves
as it would, and returns what the sampler reads: one row of logits per
request. ``ForwardBatch``, sampling, pools and the scheduler stay real.

Each row is one-hot (a large logit) on a token that is a pure function of
the request's last input token and its sequence length, so every rank
computes the same tokens, a retracted request resumes the same sequence,
and about one step in ``STOP_ONE_IN`` emits EOS: requests stop at EOS the
way real decoding does, after a deterministic, request-dependent number of
steps (unless the request sets ``ignore_eos``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from schedtrace.tracer.sandbox.assets.make_tiny_model import SPECIAL_TOKENS

MODEL_RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
STOP_ONE_IN = 32  # EOS chance per step: 1/32, so the mean output is about 32 tokens
FIRST_WORD_ID = len(SPECIAL_TOKENS)  # ids below are <unk>, <s>, </s>
CHOSEN_LOGIT = 1.0e4  # softmax puts all the mass on the chosen token, at any temperature >= 0.01


def next_tokens(last_ids, seq_lens, vocab_size: int, eos_id: int | None):
    """The stand-in's next token per request (int64 tensors in, int64 tensor out)."""
    import torch

    h = (last_ids.to(torch.int64) * 2654435761 + seq_lens.to(torch.int64) * 40503 + 12345) & 0x7FFFFFFF
    h = ((h ^ (h >> 13)) * 1274126177) & 0x7FFFFFFF
    words = FIRST_WORD_ID + h % (vocab_size - FIRST_WORD_ID)
    if eos_id is None:
        return words
    return torch.where((h >> 9) % STOP_ONE_IN == 0, torch.full_like(words, eos_id), words)


def stand_in_completion(prompt_ids: list[int], max_new_tokens: int, vocab_size: int, eos_id: int | None) -> list[int]:
    """The output ids a request gets from the stand-in: up to and including EOS, or max_new_tokens.

    Prefill ends at the prompt's last token with sequence length ``len(prompt)``;
    each decode step feeds the previous output at the next length.
    """
    import torch

    out: list[int] = []
    last, length = prompt_ids[-1], len(prompt_ids)
    while len(out) < max_new_tokens:
        last = int(next_tokens(torch.tensor([last]), torch.tensor([length]), vocab_size, eos_id)[0])
        out.append(last)
        length += 1
        if last == eos_id:
            break
    return out


def one_hot_logits(tokens, vocab_size: int):
    import torch

    logits = torch.zeros((tokens.shape[0], vocab_size), dtype=torch.float32, device=tokens.device)
    logits[torch.arange(tokens.shape[0], device=tokens.device), tokens] = CHOSEN_LOGIT
    return logits


def last_input_ids(forward_batch: Any):
    """Each request's last input token: the decode token, or the extend's final one."""
    import torch

    mode = forward_batch.forward_mode
    ids = forward_batch.input_ids
    if mode.is_decode() or mode.is_idle():
        return ids[: forward_batch.batch_size]
    ends = torch.cumsum(forward_batch.extend_seq_lens.to(torch.int64), dim=0) - 1
    return ids[ends]


def eos_of(model_config: Any) -> int | None:
    eos = getattr(model_config, "hf_eos_token_id", None)
    if isinstance(eos, int):
        return eos
    return min(eos) if eos else None


def _stand_in_forward_raw(self, forward_batch, pp_proxy_tensors=None, reinit_attn_backend=False, split_forward_count=1):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.model_runner import ModelRunnerOutput

    # Keep the mamba pool's deferred clear/COW: the scheduler's prefix reuse depends on it.
    self._maybe_execute_deferred_mamba_cow_and_clear(forward_batch)
    vocab = self.model_config.vocab_size
    if forward_batch.batch_size == 0 or forward_batch.forward_mode.is_idle():
        import torch

        logits = torch.zeros((0, vocab), dtype=torch.float32)
    else:
        tokens = next_tokens(last_input_ids(forward_batch), forward_batch.seq_lens, vocab, eos_of(self.model_config))
        logits = one_hot_logits(tokens, vocab)
    return ModelRunnerOutput(logits_output=LogitsProcessorOutput(next_token_logits=logits), can_run_graph=False)


def _patch(module: ModuleType) -> None:
    module.ModelRunner._forward_raw = _stand_in_forward_raw


def install() -> None:
    from schedtrace.tracer.sandbox.standins.import_hooks import after_import

    after_import(MODEL_RUNNER_MODULE, _patch)
