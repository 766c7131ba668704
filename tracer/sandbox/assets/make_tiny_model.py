"""Regenerate the tiny models the CPU sandbox serves (configs + tokenizer).

Run ``python -m schedtrace.tracer.sandbox.assets.make_tiny_model`` (or this
file directly). The output is deterministic, built offline with the
``tokenizers`` library, and is shipped in the repository so nothing is
downloaded at run time. Weights are not stored: the sandbox launches sglang
with ``--load-format dummy``. Every model serves the same tokenizer, stored
once in ``tokenizer/`` (``TOKENIZER_DIR``); each model folder holds its own
``config.json`` (``CONFIGS``: folder name -> config) and relative symbolic
links to the tokenizer files, so sglang and its bench client find a whole
model at ``--model-path``/``--tokenizer`` as before. (A built wheel or sdist
holds copies where the links were: setuptools copies the files they point at.)

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

ASSETS_DIR = Path(__file__).resolve().parent
MODEL_DIR = ASSETS_DIR / "tiny-llama"
TOKENIZER_DIR = ASSETS_DIR / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# What every tiny config shares: the vocabulary, the special ids, fp32.
_COMMON: dict = {
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": UNK_ID,
}

LLAMA_CONFIG: dict = {
    **_COMMON,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
}


# Qwen3-Next: gated-delta-net (GDN) linear attention on layer 0, full
# attention on layer 1 (full_attention_interval 2), a 4-expert MoE.
QWEN3_NEXT_CONFIG: dict = {
    **_COMMON,
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "mlp_only_layers": [],
}

# Kimi-Linear: Kimi delta attention (KDA, linear) on layer 1 and MLA (latent
# full attention) on layer 2 (1-based in linear_attn_config), a dense MLP.
# (With 4 experts it serves too, but its grouped top-k is torch.compile'd at
# start-up, which the tests pay for every run.)
KIMI_LINEAR_CONFIG: dict = {
    **_COMMON,
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
    "q_lora_rank": None,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "mla_use_nope": True,
    "linear_attn_config": {
        "kda_layers": [1], "full_attn_layers": [2],
        "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
    },
}

# gpt-oss: a sliding-window layer (window 128) and a full-attention layer,
# attention sinks, a 4-expert MoE; unquantized (no mxfp4 config).
GPT_OSS_CONFIG: dict = {
    **_COMMON,
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "hidden_act": "silu",
    "attention_bias": True,
    "rope_theta": 150000.0,
    "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096,
    },
}

# sglang's dynamic-chunking profiler (``DynamicChunkSizer._profile_prefill_latency``) prefills
# prompts of ids drawn below 10,000; in a 512-word embedding they fail and chunking stays static.
# The tokenizer stays the shared 512 words: the loads send ids below 512, and an id past the
# tokenizer decodes to nothing.
WIDE_VOCAB_SIZE = 10240
LLAMA_WIDE_VOCAB_CONFIG: dict = {**LLAMA_CONFIG, "vocab_size": WIDE_VOCAB_SIZE}

CONFIGS: dict[str, dict] = {
    "tiny-llama": LLAMA_CONFIG,
    "tiny-llama-wide-vocab": LLAMA_WIDE_VOCAB_CONFIG,
    "tiny-kimi-linear": KIMI_LINEAR_CONFIG,
    "tiny-qwen3-next": QWEN3_NEXT_CONFIG,
    "tiny-gpt-oss": GPT_OSS_CONFIG,
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


def _json(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_tokenizer(out_dir: Path = TOKENIZER_DIR) -> list[Path]:
    """The one tokenizer every model serves."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = dict(zip(TOKENIZER_FILES, (
        build_tokenizer_json(),
        _json(tokenizer_config()),
        _json({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>"}),
    )))
    for name, text in files.items():
        (out_dir / name).write_text(text, encoding="utf-8")
    return [out_dir / name for name in files]


def write_model(out_dir: Path = MODEL_DIR, config: dict = LLAMA_CONFIG,
                tokenizer_dir: Path = TOKENIZER_DIR) -> list[Path]:
    """A model folder: its config, and links to the shared tokenizer (written by ``write_tokenizer``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.json"
    config_path.write_text(_json(config), encoding="utf-8")
    written = [config_path]
    for name in TOKENIZER_FILES:
        link = out_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..") / tokenizer_dir.name / name)  # relative: the tree moves as a whole
        written.append(link)
    return written


def write_all(assets_dir: Path = ASSETS_DIR) -> list[Path]:
    tokenizer_dir = assets_dir / TOKENIZER_DIR.name
    return [*write_tokenizer(tokenizer_dir),
            *(path for name, config in CONFIGS.items() for path in write_model(assets_dir / name, config, tokenizer_dir))]


if __name__ == "__main__":
    for path in write_all():
        print(path)
