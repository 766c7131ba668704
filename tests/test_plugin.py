"""The sglang entry point against the installed sglang: every hook point resolves,
and a release or hook point that is off is reported in one warning."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from schedtrace.replay.sglang_env import ensure_sglang_importable
from schedtrace.tracer import plugin
from schedtrace.tracer.contract.names import DIR_ENV, FIXES_ENV, OTEL_ENV, PINNED_SGLANG
from schedtrace.tracer.contract.versions import installed_version
from schedtrace.tracer.kernel_stub import STUB_DIR
from schedtrace.tracer.recorder.targets import PASS_TARGET, PASS_TARGETS

# This process resolves hook points too: sglang must be importable here, as on a GPU host.
ensure_sglang_importable()

REPO = Path(__file__).resolve().parents[1]
NO_SUCH_POINT = "sglang.srt.managers.scheduler.Scheduler.no_such_hook_point"

# A fresh process, as sglang starts one: the plugin found through its entry
# point, registered, and the hooks applied by sglang's own HookRegistry.
LOAD_SCRIPT = textwrap.dedent(
    """
    import json, logging, pkgutil, sys
    from importlib.metadata import entry_points
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s|%(message)s")
    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "schedtrace"]
    ep.load()()
    from sglang.srt.plugins.hook_registry import HookRegistry
    from schedtrace.tracer import plugin
    from schedtrace.tracer.recorder.hooks import make_hooks
    HookRegistry.apply_hooks()
    targets = sorted({target for target, _ in make_hooks(plugin._recorder)})
    print(json.dumps({
        "targets": targets,
        "registered": sorted(HookRegistry._hooks),
        "applied": [t for t in targets if hasattr(pkgutil.resolve_name(t), "__wrapped__")],
    }))
    """
)


def test_the_plugin_hooks_every_point_of_the_installed_sglang(tmp_path: Path) -> None:
    assert installed_version("sglang") == PINNED_SGLANG  # what the recorder is written against
    env = {k: v for k, v in os.environ.items() if k not in (FIXES_ENV, OTEL_ENV, "SGLANG_PLUGINS")}
    env[DIR_ENV] = str(tmp_path)
    # As every sglang process on this GPU-less machine: the sgl_kernel import stand-in first
    # (without it, sglang's CPU engine cannot import the scheduler at all).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STUB_DIR), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["targets"] and set(PASS_TARGETS) <= set(seen["targets"])
    assert seen["registered"] == seen["targets"]  # no hook point left out
    assert seen["applied"] == seen["targets"]
    assert [line for line in done.stderr.splitlines() if line.startswith("schedtrace.tracer.plugin|")] == []


def plugin_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == plugin.__name__ and r.levelno == logging.WARNING]


def test_an_unresolvable_hook_point_is_named_in_the_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    installed = installed_version("sglang")
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        missing = plugin.missing_hook_points([*PASS_TARGETS, NO_SUCH_POINT], installed)
    assert missing == [NO_SUCH_POINT]
    (message,) = plugin_warnings(caplog)
    assert NO_SUCH_POINT in message and f"sglang {installed}" in message


def test_another_sglang_release_is_named_in_the_same_warning(caplog: pytest.LogCaptureFixture) -> None:
    other = "0.5.22"  # an installed release other than the pinned one
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        assert plugin.missing_hook_points([PASS_TARGET, NO_SUCH_POINT], other) == [NO_SUCH_POINT]
        assert plugin.missing_hook_points([PASS_TARGET], other) == []
        assert plugin.missing_hook_points(PASS_TARGETS, PINNED_SGLANG) == []
    both, version_only = plugin_warnings(caplog)  # the pinned release, all resolved: no warning
    assert f"sglang {other}" in both and PINNED_SGLANG in both and NO_SUCH_POINT in both
    assert f"sglang {other}" in version_only and PINNED_SGLANG in version_only and "missing" not in version_only


@pytest.mark.parametrize(("value", "on"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_otel_mirror_follows_the_boolean_flag(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv(OTEL_ENV, value)
    sinks = plugin.otel_sinks()
    assert len(sinks) == int(on)
    for sink in sinks:
        sink.close()
