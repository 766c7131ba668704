"""Every setting sglang's scheduling code reads is recorded, or left out with its reason.

The walk reads sglang's own source (the scheduler, the policy, the batch and
mem_cache/) for ``server_args.FIELD``, the config bags (``get_schedule().FIELD``,
``get_memory().FIELD``, and every other bag as a whole), ``envs.NAME`` and
``os.environ`` names, so a new release cannot add one silently.
"""

from __future__ import annotations

import re
from pathlib import Path

import sglang

from schedtrace.tracer.analysis import settings
from schedtrace.tracer.contract.schema import ServerArgs

SRT = Path(sglang.__file__).parent / "srt"
MODULES = [SRT / "managers" / "scheduler.py", SRT / "managers" / "schedule_policy.py",
           SRT / "managers" / "schedule_batch.py", SRT / "managers" / "scheduler_components" / "dynamic_chunk_sizer.py",
           *sorted((SRT / "mem_cache").rglob("*.py"))]
FIELD = re.compile(r"(?:server_args|get_schedule\(\)|get_memory\(\))\.([a-z_][a-z_0-9]*)")
BAG = re.compile(r"\bget_([a-z]+)\(\)\.")
ENV = re.compile(r"\benvs\.([A-Z_][A-Z_0-9]*)")
OS_ENV = re.compile(r"""os\.(?:environ(?:\.get)?[\[(]|getenv\()\s*["']((?:SGLANG|IN_BATCH)_[A-Z_0-9]+)["']""")


def _reads() -> tuple[set[str], set[str]]:
    names, bags = set(), set()
    for path in MODULES:
        text = path.read_text()
        names |= set(FIELD.findall(text)) | set(ENV.findall(text)) | set(OS_ENV.findall(text))
        bags |= set(BAG.findall(text))
    return names, bags


def _recorded() -> set[str]:
    return (set(ServerArgs.__struct_fields__) | set(settings.SERVER_SETTINGS) | set(settings.ENV_SETTINGS)
            | set(settings.MODULE_SETTINGS) | {"max_total_tokens", "max_running_requests", "page_size"})


def test_every_setting_read_is_recorded_or_neutral_with_a_reason() -> None:
    names, bags = _reads()
    assert len(names) > 100  # the walk found sglang's reads
    missing = sorted(n for n in names if n not in _recorded() and not settings.neutral_reason(n))
    assert missing == []
    assert sorted(bags - {"schedule", "memory"} - set(settings.NEUTRAL_BAGS)) == []


def test_the_walk_finds_the_settings_the_issue_names() -> None:
    names, _ = _reads()
    for name in ("schedule_low_priority_values_first", "priority_scheduling_preemption_threshold",
                 "prefill_max_requests", "enable_dynamic_chunking", "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
                 "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "SGLANG_TEST_RETRACT", "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"):
        assert name in names and name in _recorded()


def test_a_setting_is_recorded_or_neutral_never_both() -> None:
    assert not {n for n in _recorded() if n in settings.DECISION_NEUTRAL}
    assert set(settings.REPLAYED) <= _recorded()
    assert set(settings.ASSUMED) <= _recorded()


def test_a_recorded_value_replay_cannot_reproduce_is_named() -> None:
    assert settings.unreplayed({"enable_lora": True}) == ["enable_lora=True: replay runs as if False"]
    # Priority preemption replays: each release is recorded (Pass.released).
    assert settings.unreplayed({"enable_lora": False, "disable_priority_preemption": False}) == []


def test_a_setting_read_per_request_answers_what_replay_runs_under_not_this_process(monkeypatch) -> None:
    """sglang reads SGLANG_RADIX_FORCE_MISS on every match of a pass; replay answers the recorded value
    (sglang's default for this trace, from before settings were recorded), so a replaying process that
    sets it still reproduces an lpm trace, and reads its own value again once the replay is done."""
    from sglang.srt.environ import envs

    from schedtrace.replay.engine import replay_trace

    monkeypatch.setenv("SGLANG_RADIX_FORCE_MISS", "1")
    report = replay_trace(Path(__file__).resolve().parent.parent / "traces" / "kv-pressure-lpm-24k.trace", "stock",
                          jobs=1)
    assert report.fidelity.matched == report.fidelity.total > 1000
    assert envs.SGLANG_RADIX_FORCE_MISS.get() is True and "get" not in vars(envs.SGLANG_RADIX_FORCE_MISS)
