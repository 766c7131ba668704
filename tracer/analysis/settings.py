"""The scheduler settings a trace records (``Header.settings``) and what replay does with each.

Pure names: the recorder reads them (tracer/recorder/settings.py), replay
applies the ones in ``REPLAYED`` and warns on a recorded value it cannot
reproduce (``unreplayed``). tests/test_settings.py walks sglang's scheduling
modules: every setting they read is here, in ``ServerArgs`` (schema.py), or in
``DECISION_NEUTRAL`` with its reason.
"""

from __future__ import annotations

from typing import Final

# ServerArgs fields beyond schema.ServerArgs that a scheduling pass or the queue reads.
SERVER_SETTINGS: Final = (
    "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold",
    "disable_priority_preemption",
    "abort_on_priority_when_disabled",
    "default_priority_value",
    "prefill_max_requests",
    "enable_dynamic_chunking",
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
    "SGLANG_RADIX_FORCE_MISS",
    "SGLANG_EXACT_CHUNK_FILL",
    "SGLANG_TEST_RETRACT_INTERVAL",
    "SGLANG_SWA_EVICTION_INTERVAL",
    "SGLANG_REQ_WAITING_TIMEOUT",
    "SGLANG_REQ_RUNNING_TIMEOUT",
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
    "SGLANG_TEST_RETRACT": (SCHEDULER_MODULE, "TEST_RETRACT"),
    "SGLANG_TEST_RETRACT_NO_PREFILL_BS": (SCHEDULER_MODULE, "TEST_RETRACT_NO_PREFILL_BS"),
}

# What replay sets from the recorded value before it runs a pass (replay/settings.py).
REPLAYED: Final = frozenset({
    "schedule_low_priority_values_first",
    "prefill_max_requests",
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
    "SGLANG_TEST_RETRACT_INTERVAL": "retraction runs in decode; the trace records each retract",
    "SGLANG_REQ_WAITING_TIMEOUT": "a timeout aborts outside the pass; the trace records the abort",
    "SGLANG_REQ_RUNNING_TIMEOUT": "a timeout aborts outside the pass; the trace records the abort",
    "SGLANG_SWA_EVICTION_INTERVAL": "eviction between passes: the recorded counts already hold it",
    "SGLANG_ENABLE_WAITING_PREFIX_REFRESH": "touches LRU recency only; the recorded matches hold the tree",
    "radix_eviction_policy": "eviction order between passes: the recorded counts and matches hold it",
    "retraction_policy": "retraction runs in decode; the trace records each retract",
    "mamba_full_memory_ratio": "sizes the pools at start; the header records the pools",
    "max_mamba_cache_size": "sizes the pools at start; the header records the pools",
    "enable_dynamic_chunking": "each pass records the chunk size the sizer chose",
}

# Recorded values replay cannot reproduce: (setting, value replay assumes). Another value warns.
ASSUMED: Final = {
    "disable_priority_preemption": True,  # replay runs no preemption (it would release running KV)
    "enable_prefill_delayer": False,
    "min_free_slots_delay": None,
    "prefill_decode_interval": None,
    "enable_hierarchical_cache": False,
    "enable_lora": False,
    "speculative_algorithm": None,
    "disaggregation_mode": "null",
    "prefill_only_disable_kv_cache": False,
    "SGLANG_RADIX_FORCE_MISS": False,
    "SGLANG_EXACT_CHUNK_FILL": None,  # the header's exact_chunk_fill is what replay injects
}


def unreplayed(settings: dict[str, object], enable_priority_scheduling: bool) -> list[str]:
    """One line per recorded setting whose value replay does not reproduce."""
    out = []
    for name, assumed in ASSUMED.items():
        if name not in settings:
            continue
        value = settings[name]
        if name == "disable_priority_preemption":
            if enable_priority_scheduling and not value:
                out.append("priority preemption was on: replay admits without preempting running requests")
            continue
        if name == "SGLANG_EXACT_CHUNK_FILL" or value in (assumed, None, "", 0) or value == assumed:
            continue
        out.append(f"{name}={value!r}: replay runs as if {assumed!r}")
    return out
