"""The scheduler settings a trace records (``Header.settings``) and what replay does with each.

Pure names: the recorder reads them (tracer/recorder/settings.py), replay
applies the ones in ``REPLAYED`` and warns on a recorded value it cannot
reproduce (``unreplayed``). tests/test_settings.py walks sglang's scheduling
modules: every setting they read is here, in ``ServerArgs`` (schema.py), or in
``DECISION_NEUTRAL`` with its reason.
"""

from __future__ import annotations

from typing import Final

from schedtrace.tracer.contract.names import (
    SGLANG_RADIX_FORCE_MISS, SGLANG_SWA_EVICTION_INTERVAL_ENV, SGLANG_TEST_RETRACT, SGLANG_TEST_RETRACT_INTERVAL,
)

# ServerArgs fields beyond schema.ServerArgs that a scheduling pass or the queue reads.
SERVER_SETTINGS: Final = (
    "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold",
    "disable_priority_preemption",
    "abort_on_priority_when_disabled",
    "default_priority_value",
    "prefill_max_requests",
    "enable_dynamic_chunking",
    "pp_max_micro_batch_size",
    "pp_async_batch_depth",
    "num_continuous_decode_steps",
    "max_queued_requests",
    "enable_prefill_delayer",
    "prefill_delayer_max_delay_passes",
    "prefill_delayer_token_usage_low_watermark",
    "min_free_slots_delay",
    "prefill_decode_interval",
    "prefill_decode_interval_min_bs",
    "retraction_policy",
    "radix_eviction_policy",
    "enable_hierarchical_cache",
    "enable_lora",
    "speculative_algorithm",
    "disaggregation_mode",
    "max_mamba_cache_size",
    "mamba_full_memory_ratio",
    "prefill_only_disable_kv_cache",
)

# Environment settings sglang declares in ``sglang.srt.environ.envs``, read as ``envs.NAME.get()``.
ENV_SETTINGS: Final = (
    "SGLANG_INIT_NEW_TOKEN_RATIO",
    "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR",
    "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS",
    "SGLANG_RETRACT_DECODE_STEPS",
    "SGLANG_MAX_NEW_TOKENS_LIMIT",
    "SGLANG_ENABLE_WAITING_PREFIX_REFRESH",
    SGLANG_RADIX_FORCE_MISS,
    "SGLANG_EXACT_CHUNK_FILL",
    SGLANG_TEST_RETRACT_INTERVAL,
    SGLANG_SWA_EVICTION_INTERVAL_ENV,
    "SGLANG_REQ_WAITING_TIMEOUT",
    "SGLANG_REQ_RUNNING_TIMEOUT",
    "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR",
)

POLICY_MODULE: Final = "sglang.srt.managers.schedule_policy"
SCHEDULER_MODULE: Final = "sglang.srt.managers.scheduler"
# Environment settings sglang reads once at import into module constants: env name -> (module, constant).
MODULE_SETTINGS: Final = {
    "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD": (POLICY_MODULE, "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD"),
    "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD": (POLICY_MODULE, "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD"),
    "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": (POLICY_MODULE, "CLIP_MAX_NEW_TOKENS"),
    "SGLANG_PREFILL_TILE_BUDGET": (POLICY_MODULE, "PREFILL_TILE_BUDGET"),
    "SGLANG_PREFILL_TILE_BUDGET_MODE": (POLICY_MODULE, "PREFILL_TILE_BUDGET_MODE"),
    SGLANG_TEST_RETRACT: (SCHEDULER_MODULE, "TEST_RETRACT"),
    "SGLANG_TEST_RETRACT_NO_PREFILL_BS": (SCHEDULER_MODULE, "TEST_RETRACT_NO_PREFILL_BS"),
}

# Environment settings sglang reads on every request of a pass (``envs.NAME.get()``); replay answers
# each with its recorded value (replay/server_env.py ``per_request_envs``).
PER_REQUEST_ENVS: Final = (SGLANG_RADIX_FORCE_MISS, "SGLANG_ENABLE_WAITING_PREFIX_REFRESH")

# What replay sets from the recorded value before it runs a pass (replay/server_env.py).
REPLAYED: Final = frozenset({
    "schedule_low_priority_values_first",
    "disable_priority_preemption",  # each release is recorded (Pass.released)
    "priority_scheduling_preemption_threshold",
    "prefill_max_requests",
    *PER_REQUEST_ENVS,
    *MODULE_SETTINGS,
})

# Settings the open-loop pass never reads with a value that changes its decision, and why.
# (The closed loop reads some of them; docs/closed-loop.md says which it models.)
OPEN_LOOP_NEUTRAL: Final = {
    "num_continuous_decode_steps": "decode steps between passes: the recorded passes already hold their effect",
    "max_queued_requests": "a rejection happens at arrival, before any pass; the trace records its abort",
    "default_priority_value": "applied at arrival; the recorded priorities already hold it",
    "abort_on_priority_when_disabled": "applied at arrival; the trace records the abort",
    "SGLANG_INIT_NEW_TOKEN_RATIO": "the ratio's evolution: every pass records the ratio it used",
    "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": "the ratio's evolution: every pass records the ratio it used",
    "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "the ratio's evolution: every pass records the ratio it used",
    "SGLANG_RETRACT_DECODE_STEPS": "retraction runs in decode; the trace records each retract",
    "SGLANG_MAX_NEW_TOKENS_LIMIT": "applied at arrival; the recorded max_new_tokens already hold it",
    SGLANG_TEST_RETRACT_INTERVAL: "retraction runs in decode; the trace records each retract",
    "SGLANG_REQ_WAITING_TIMEOUT": "a timeout aborts outside the pass; the trace records the abort",
    "SGLANG_REQ_RUNNING_TIMEOUT": "a timeout aborts outside the pass; the trace records the abort",
    SGLANG_SWA_EVICTION_INTERVAL_ENV: "eviction between passes: the recorded counts already hold it (the closed loop reads it)",
    "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "touches LRU recency only; the recorded matches hold the tree",
    "radix_eviction_policy": "eviction order between passes: the recorded counts and matches hold it",
    "retraction_policy": "retraction runs in decode; the trace records each retract",
    "mamba_full_memory_ratio": "sizes the pools at start; the header records the pools",
    "max_mamba_cache_size": "sizes the pools at start; the header records the pools",
    "enable_dynamic_chunking": "each pass records the chunk size the sizer chose",
    "pp_async_batch_depth": "how many micro-batches the pipeline loops over: each pass records its own "
                            "micro-batch's running batch (the closed loop reads it)",
    "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": "each pass records the chunk size the sizer chose (the closed loop reads it)",
}

# Recorded values replay cannot reproduce: (setting, value replay assumes). Another value warns.
ASSUMED: Final = {
    "enable_prefill_delayer": False,
    "min_free_slots_delay": None,
    "prefill_decode_interval": None,
    "enable_hierarchical_cache": False,
    "enable_lora": False,
    "speculative_algorithm": None,
    "disaggregation_mode": "null",
    "prefill_only_disable_kv_cache": False,
    "SGLANG_EXACT_CHUNK_FILL": None,  # the header's exact_chunk_fill is what replay injects
}


def unreplayed(settings: dict[str, object]) -> list[str]:
    """One line per recorded setting whose value replay does not reproduce."""
    out = []
    for name, assumed in ASSUMED.items():
        if name not in settings:
            continue
        value = settings[name]
        if name == "SGLANG_EXACT_CHUNK_FILL" or value in (assumed, None, "", 0) or value == assumed:
            continue
        out.append(f"{name}={value!r}: replay runs as if {assumed!r}")
    return out


# --- what the scheduling code reads and this file leaves out, with why (tests/test_settings.py) ---

_STORAGE = "a host or storage cache tier: read only with the hierarchical cache, which is recorded and warned on"
_KERNEL = "a kernel, layout or device choice of the forward or the pools' memory: not an admission input"
_DEBUG = "debugging, logging or a test hook of another subsystem: no decision reads it"
_START = "sizes or builds pools and threads at start: the header records the pools built"
_BETWEEN = "how memory is handled between passes or in the forward: the recorded counts hold its effect"

# Families of names, by prefix.
NEUTRAL_PREFIXES: Final = {
    "MOONCAKE_": _STORAGE, "SGLANG_HICACHE_": _STORAGE, "SGLANG_TEST_HICACHE": _STORAGE,
    "hicache_": _STORAGE, "lmcache_": _STORAGE, "flexkv_": _STORAGE, "hisparse_": _STORAGE,
    "unified_cache_": _STORAGE, "SGLANG_DSV4_": _KERNEL, "SGLANG_OPT_": _BETWEEN, "SGLANG_HIP_": _KERNEL,
    "SGLANG_NPU_": _KERNEL, "SGLANG_AMD_": _KERNEL, "SGLANG_DEBUG_": _DEBUG, "SGLANG_LOG_": _DEBUG,
    "SGLANG_RUST_": _START, "SGLANG_MM_": _KERNEL,
}

# Single names.
DECISION_NEUTRAL: Final = {
    # ServerArgs (schedule and memory) fields
    "disable_overlap_schedule": "the header records whether the overlap loop ran (overlap_schedule)",
    "mem_fraction_static": _START,
    "enable_flexkv": _STORAGE, "enable_lmcache": _STORAGE, "enable_hisparse": _STORAGE,
    "enable_unified_cache_external_linker": _STORAGE,
    "enable_page_major_kv_layout": _KERNEL,
    "enable_session_radix_cache": "streaming sessions reuse a slot outside the queue: not replayed",
    "enable_unified_memory": "refused by replay: hybrid pools in one byte envelope (replay.hybrid)",
    "radix_cache_backend": "the tree's implementation, recorded as the header's tree class",
    "radix_eviction_policy_config": "eviction order between passes: the recorded counts hold it",
    "enable_linker_mla_dedup": _KERNEL, "enable_pd_role_switch": "disaggregation, recorded as disaggregation_mode",
    "file_storage_path": _STORAGE, "sampling_mask_max_tokens": "sampling, after the batch is built",
    # environment settings
    "SGLANG_AITER_KV_CACHE_LAYOUT": _KERNEL, "SGLANG_USE_AITER": _KERNEL, "SGLANG_USE_HND_KVCACHE": _KERNEL,
    "SGLANG_MLA_DEDUP_CHUNK_TOKENS": _KERNEL, "SGLANG_NATIVE_MOVE_KV_CACHE": _KERNEL,
    "SGLANG_HUGEPAGE_SIZE": _START, "SGLANG_NUMA_BIND_V2": _START, "SGLANG_SET_CPU_AFFINITY": _START,
    "SGLANG_VLM_CACHE_SIZE_MB": _START, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": _STORAGE,
    "SGLANG_COMPACTION_MAX_PAGES_PER_MOVE": "page compaction moves KV without changing counts",
    "SGLANG_DISABLE_LAZY_COMPACTION": "page compaction moves KV without changing counts",
    "SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL": "page compaction moves KV without changing counts",
    "SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP": "the overlap loop's batching, after the pass",
    "SGLANG_DISABLE_FUSED_MAMBA_SLOT_OPS": _KERNEL,
    "SGLANG_DISAGG_STAGING_BUFFER": "disaggregation, recorded as disaggregation_mode",
    "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": "speculative decoding, recorded as speculative_algorithm",
    "SGLANG_ENABLE_PP_SPEC": "speculative decoding, recorded as speculative_algorithm",
    "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": "speculative decoding, recorded as speculative_algorithm",
    "SGLANG_ENABLE_HICACHE_SWA_TAIL_ONLY_BACKUP": _STORAGE,
    "SGLANG_ENABLE_KV_SHARD_ZERO_SM_GATHER": _KERNEL, "SGLANG_ENABLE_WAR_BARRIER": _KERNEL,
    "SGLANG_FORCE_COARSE_WAR_BARRIER": _KERNEL,
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": _DEBUG, "SGLANG_KILLPG_ON_SCHEDULER_EXCEPTION": _DEBUG,
    "SGLANG_MAMBA_DEBUG_ASSERTS": _DEBUG, "SGLANG_TEST_MAMBA_LAZY_ALLOC_FAIL": _DEBUG,
    "SGLANG_TEST_SCRIPTED_RUNTIME": _DEBUG, "SGLANG_TEST_STUCK_SCHEDULER_INIT": _DEBUG,
    "SGLANG_PREFILL_DELAYER_MAX_PREFILL_BS_WINDOW_SIZE": "the prefill delayer, recorded as enable_prefill_delayer",
    "SGLANG_SCHEDULER_MAX_RECV_PER_POLL": "how many requests one poll reads: the arrivals are recorded",
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "the tree's implementation, recorded as the header's tree class",
    "SGLANG_DP_RANK": "the rank, recorded in the header",
}

# Config bags other than schedule and memory, each as a whole.
NEUTRAL_BAGS: Final = {
    "context": "sglang's config registry itself",
    "device": "the device and its watchdogs",
    "disagg": "disaggregation, recorded as disaggregation_mode (warned on)",
    "exec": "kernels, graphs and the mamba extra buffer: the header records the chunk grid and the pools",
    "kvcache": "the KV pool's memory: the header records the pools",
    "lora": "adapters, recorded as enable_lora (warned on)",
    "mm": "multimodal inputs, before the queue",
    "model": "the model: the header records its path",
    "observability": "metrics and tracing",
    "parallel": "ranks and groups: the header records every rank and size, and replay runs one rank",
    "platform": "the hardware family: the header records exact_chunk_fill, the one admission input from it",
    "serving": "tokenizer and HTTP serving, before the queue",
    "spec": "speculative decoding, recorded as speculative_algorithm (warned on)",
}


def neutral_reason(name: str) -> str | None:
    """Why ``name`` is left out of ``Header.settings`` (None: it is not)."""
    if name in DECISION_NEUTRAL:
        return DECISION_NEUTRAL[name]
    return next((why for prefix, why in NEUTRAL_PREFIXES.items() if name.startswith(prefix)), None)
