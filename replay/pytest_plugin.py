"""pytest plugin (entry point ``pytest11``): ``SCHEDTRACE_FIXES`` applies the fixes inside pytest.

``SCHEDTRACE_FIXES=latch python -m pytest test_x.py`` runs the test against
sglang with the ``latch`` fix applied (``SCHEDTRACE_FIXES=./mine.diff``: with an
sglang diff, or an edits module, applied: ``schedtrace.arms.user``), through the same call a live server
makes (``schedtrace.arms.variants.install_fixes_from_env``), before any test
module is collected. ``schedtrace repro`` verifies the tests it emits this
way: once on stock, once per fix.

Unset or empty, the plugin does nothing and imports nothing beyond this
module: no sglang, no schedtrace code.
"""

from __future__ import annotations

import os

import pytest

# The one spelling of the variable (schedtrace.tracer.contract.names.FIXES_ENV),
# repeated here so that an unset variable costs no import.
_FIXES_ENV = "SCHEDTRACE_FIXES"
_status_line: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _status_line
    value = os.environ.get(_FIXES_ENV, "").strip()
    if not value:
        return
    from schedtrace.arms.variants import install_fixes_from_env, parse_variant
    from schedtrace.tracer.contract.errors import SchedtraceError
    from schedtrace.tracer.contract.names import FIXED

    try:
        parse_variant(FIXED if value == "all" else value)  # a bad name or diff fails before sglang is imported
    except SchedtraceError as exc:
        raise pytest.UsageError(f"{_FIXES_ENV}={value}: {exc}") from None
    from schedtrace.replay.sglang_env import ensure_sglang_importable

    ensure_sglang_importable()  # applying a fix imports sglang; sgl_kernel needs libcuda
    from schedtrace.arms.patching import EditStatus, sglang_version

    try:
        statuses = install_fixes_from_env()
    except SchedtraceError as exc:
        raise pytest.UsageError(f"{_FIXES_ENV}={value}: {exc}") from None
    fixes = ", ".join(
        f"{fix} {'applied' if status is EditStatus.PATCHABLE else status.value}" for fix, status in statuses.items()
    )
    _status_line = f"schedtrace: {_FIXES_ENV}={value}: {fixes}; sglang {sglang_version()}"


def pytest_report_header(config: pytest.Config) -> str | None:
    return _status_line
