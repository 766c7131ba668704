"""Regenerate the tiny Llama the CPU sandbox serves (config + tokenizer).

Run ``python -m schedtrace.tracer.sandbox.assets.make_tiny_model`` (or this file directly). The
output is deterministic, built offline with the ``tokenizers`` library, and is
shipped in the repository so nothing is downloaded at run time. Weights are
not stored: the sandbox launches sglang with ``--load-format dummy``.

The tokenizer is a word-level vocabulary of exactly ``VOCAB_SIZE`` entries so
that every id the dummy model can emit decodes to visible text (sglang's
bench client only counts a streamed chunk once its text is non-empty).
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

MODEL_DIR = Path(__file__).resolve().parent / "tiny-llama"

LLAMA_CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 16384,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": UNK_ID,
}


def word_for(index: int) -> str:
    """A short, distinct, whitespace-free word for non-special id ``index``."""
    return f"w{index:03d}"


def build_vocab() -> dict[str, int]:
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), VOCAB_SIZE):
        vocab[word_for(i)] = i
    return vocab


def build_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab=build_vocab(), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Join words with a space on decode so text re-encodes to the same ids.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return json.dumps(json.loads(tokenizer.to_str()), indent=1, sort_keys=True) + "\n"


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": LLAMA_CONFIG["max_position_embeddings"],
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }


def write_model(out_dir: Path = MODEL_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": json.dumps(LLAMA_CONFIG, indent=1, sort_keys=True) + "\n",
        "tokenizer.json": build_tokenizer_json(),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=1, sort_keys=True)
        + "\n",
        "special_tokens_map.json": json.dumps(
            {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>"},
            indent=1,
            sort_keys=True,
        )
        + "\n",
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_model():
        print(path)
