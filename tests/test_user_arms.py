"""User arms: an sglang diff (or an edits module) as an arm, against the real sglang 0.5.23 source.

Diffs here are made the way an sglang PR's are: ``difflib`` over the
installed file's text, named ``a/python/sglang/...``; the shipped
``builtin-fixes.diff`` is the four fixes in that form.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schedtrace.arms import user, variants
from schedtrace.arms.shipped import BUILTIN_DIFF_PATH, render_builtin_diff
from schedtrace.arms.unidiff import installed_root
from schedtrace.cli import run
from schedtrace.tracer.contract.errors import ArmPatchError, UsageError
from schedtrace.tracer.contract.names import ARM_FILES_ENV

REPO = Path(__file__).resolve().parent.parent
TRACES = sorted((REPO / "traces").glob("*.trace"))
LPM = REPO / "traces" / "kv-pressure-lpm-24k.trace"
POLICY = "srt/managers/schedule_policy.py"
BUDGET = "srt/mem_cache/prefill_budget.py"
CLIP = ('os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "4096")',
        'os.environ.get("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "16")')


def make_diff(path: Path, relative: str, *replacements: tuple[str, str], prefix: str = "python/sglang/",
              a: str = "a/", b: str = "b/") -> Path:
    """A git-style diff of one installed sglang file with ``replacements`` made (each must be there once)."""
    before = (installed_root() / relative).read_text()
    after = before
    for old, new in replacements:
        assert after.count(old) == 1, old
        after = after.replace(old, new)
    name = f"{prefix}{relative}"
    body = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"{a}{name}", f"{b}{name}")
    path.write_text(f"diff --git a/{name} b/{name}\n" + "".join(body))
    return path


def decisions(trace: Path, arms: list[str]) -> list[list]:
    """Per pass record (and aiter event) of ``trace``, each arm's decision, the arms alternating pass by pass."""
    from schedtrace.replay.driver import PassDriver
    from schedtrace.tracer.analysis.decision import replay_inputs
    from schedtrace.tracer.contract.format import TraceReader
    from schedtrace.tracer.contract.schema import Aiter, Pass

    out = []
    with TraceReader(trace, skip_damaged=True) as reader:
        driver = PassDriver(reader.header)
        for _, record in reader.records(0):
            if type(record) is Pass:
                p = replay_inputs(record)
                out.append([driver.decide(p, arm) for arm in arms])
            elif type(record) is Aiter:
                out.append([driver.decide_aiter(record, arm) for arm in arms])
    return out


@pytest.fixture(autouse=True)
def back_to_stock():
    yield
    variants.set_active(frozenset())


# ------------------------------------------------------------------ reading and checking a diff


def test_a_diff_applies_and_is_named_by_file_and_hash_without_importing_sglang(tmp_path):
    diff = make_diff(tmp_path / "clip.diff", POLICY, CLIP)
    code = ("import sys; from schedtrace.arms import variants, user\n"
            f"v = variants.canonical_variant('latch,{diff}')\n"
            "assert 'sglang' not in sys.modules, 'planning imported sglang'\n"
            "print(v); print(user.describe(v.split(',')[1]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    label, described = done.stdout.splitlines()
    assert re.fullmatch(r"latch,clip\.diff@[0-9a-f]{12}", label)
    assert described.endswith("diff of python/sglang/srt/managers/schedule_policy.py")
    # The label is the content's: another content, another name; the same content, the same one.
    (tmp_path / "other").mkdir()
    other = make_diff(tmp_path / "other" / "clip.diff", POLICY, (CLIP[0], CLIP[1].replace("16", "32")))
    assert user.load(other) != user.load(diff) == label.split(",")[1]


@pytest.mark.parametrize("layout", ["no-prefix", "site-packages", "format-patch"])
def test_other_file_layouts_apply_as_the_git_diff_does(tmp_path, layout):
    git = user.lookup(user.load(BUILTIN_DIFF_PATH))
    text = BUILTIN_DIFF_PATH.read_text()
    if layout == "no-prefix":  # git diff --no-prefix
        text = text.replace(" a/python/", " python/").replace(" b/python/", " python/")
    elif layout == "site-packages":  # diff -ru between two installed trees
        text = re.sub(r"(---|\+\+\+) [ab]/python/sglang/", r"\1 .venv/lib/python3.11/site-packages/sglang/", text)
    else:  # git format-patch: a mail around the diff, a signature after it, a test file beside it
        text = ("From 0123abcd Mon Sep 17 00:00:00 2001\nFrom: Dev <dev@example.com>\n"
                "Subject: [PATCH] scheduler: four fixes\n\n---\n python/sglang/srt/x.py | 9 +++\n\n"
                + text + "diff --git a/test/srt/test_x.py b/test/srt/test_x.py\n--- a/test/srt/test_x.py\n"
                "+++ b/test/srt/test_x.py\n@@ -1,1 +1,2 @@\n import os\n+import sys\n-- \n2.43.0\n")
    path = tmp_path / f"{layout}.patch"
    path.write_text(text)
    loaded = user.lookup(user.load(path))
    assert loaded.targets == git.targets
    assert [p.new_text for p in loaded.plans] == [p.new_text for p in git.plans]
    assert loaded.ignored == (("b/test/srt/test_x.py",) if layout == "format-patch" else ())


def _one_line_exit_2(capsys, args: list[str], *expected: str) -> str:
    assert run(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for piece in expected:
        assert piece in err, err
    return err


def test_a_diff_that_does_not_apply_fails_in_one_line_before_any_work(tmp_path, capsys):
    bad = make_diff(tmp_path / "bad.diff", POLICY, CLIP)
    bad.write_text(bad.read_text().replace("# condition. The request", "# condition. A request"))
    _one_line_exit_2(capsys, ["replay", str(LPM), "--new", str(bad)],
                     "bad.diff: python/sglang/srt/managers/schedule_policy.py hunk 1 (@@ -", "context is not in")
    missing = make_diff(tmp_path / "missing.diff", POLICY, CLIP)
    missing.write_text(missing.read_text().replace("schedule_policy.py", "schedule_polcy.py"))
    _one_line_exit_2(capsys, ["check", str(LPM), "--new", str(missing)],
                     "python/sglang/srt/managers/schedule_polcy.py", "no such file in the installed sglang")
    created = tmp_path / "new-file.diff"
    created.write_text("--- /dev/null\n+++ b/python/sglang/srt/new.py\n@@ -0,0 +1 @@\n+X = 1\n")
    _one_line_exit_2(capsys, ["sweep", str(LPM), "--arms", f"stock,{created}", "--set", "max_running_requests=8"],
                     "the diff creates this file")
    with pytest.raises(ArmPatchError, match="patched file does not parse"):
        user.load(make_diff(tmp_path / "syntax.diff", POLICY, (CLIP[0], CLIP[0] + " +")))


def test_two_changes_of_one_function_in_one_arm_are_refused(tmp_path):
    edits = tmp_path / "latch_edits.py"
    edits.write_text("from schedtrace.arms.fixes import LATCH\nFIX = LATCH\n")
    assert variants.parse_variant(str(edits)) == {user.load(edits)}
    with pytest.raises(UsageError, match="both change sglang.srt.managers.scheduler:Scheduler._get_new_batch_prefill_raw"):
        variants.parse_variant(f"latch,{edits}")


# ------------------------------------------------------------------ the swaps, on the real code


def test_a_module_constant_diff_changes_decisions_and_reverts_exactly(tmp_path):
    from sglang.srt.managers import schedule_policy

    label = user.load(make_diff(tmp_path / "clip16.diff", POLICY, CLIP))
    original = schedule_policy.CLIP_MAX_NEW_TOKENS
    rows = decisions(LPM, ["stock", label, "stock"])
    changed = sum(stock != new for stock, new, _ in rows)
    assert changed > 0  # 27 of the 1474 passes admit more with 16 tokens reserved per request
    assert all(first == again for first, _, again in rows)  # stock after the arm is stock
    assert schedule_policy.CLIP_MAX_NEW_TOKENS is original == 4096
    with variants.applied(label):
        assert schedule_policy.CLIP_MAX_NEW_TOKENS == 16
    assert schedule_policy.CLIP_MAX_NEW_TOKENS is original


def test_new_helpers_and_class_attributes_come_and_go_with_the_arm(tmp_path):
    from sglang.srt.mem_cache import prefill_budget
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    before = (installed_root() / BUDGET).read_text()
    body = ("        available = min(chunk_limit, int(self.remaining_total))\n"
            "        # Single-pool continuation must make progress to release its KV.\n")
    cls = "class PrefillBudget:\n" if "class PrefillBudget:\n" in before else None
    assert cls is not None and before.count(body) == 1
    after = before.replace(cls, "def _chunk_floor(page_size):\n    return 2 * page_size\n\n\n" + cls
                           + "    floor_pages = 1\n", 1)
    after = after.replace(body, body + "        available -= _chunk_floor(self.page_size) * self.floor_pages\n", 1)
    assert after.count("_chunk_floor(self.page_size)") == 1
    name = f"python/sglang/{BUDGET}"
    diff = tmp_path / "helper.diff"
    diff.write_text("".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                                 f"a/{name}", f"b/{name}")))
    label = user.load(diff)
    code = PrefillBudget.available_chunk_tokens.__code__
    with variants.applied(label):
        assert PrefillBudget.floor_pages == 1 and prefill_budget._chunk_floor(16) == 32
        assert PrefillBudget.available_chunk_tokens.__code__ is not code
    assert not hasattr(PrefillBudget, "floor_pages") and not hasattr(prefill_budget, "_chunk_floor")
    assert PrefillBudget.available_chunk_tokens.__code__ is code


def test_the_shipped_diff_is_what_the_four_fixes_render_to():
    assert BUILTIN_DIFF_PATH.read_text() == render_builtin_diff(), "regenerate: python -m schedtrace.arms.shipped"


def test_the_builtin_diff_decides_as_fixed_on_every_sample_trace():
    label = user.load(BUILTIN_DIFF_PATH)
    assert len(TRACES) == 6  # every sample in traces/ (traces/README.md lists them)
    differ_from_stock = 0
    for trace in TRACES:
        rows = decisions(trace, ["fixed", label, "stock"])
        mismatched = [k for k, (fixed, diff, _) in enumerate(rows) if fixed != diff]
        assert not mismatched, f"{trace.name}: the diff decides otherwise than fixed at records {mismatched[:5]}"
        differ_from_stock += sum(fixed != stock for fixed, _, stock in rows)
    assert differ_from_stock > 0  # the comparison can fail: fixed is not stock on the samples


def test_an_arm_shipped_as_text_resolves_where_its_file_is_not(tmp_path, monkeypatch):
    """What a Ray worker gets: the arm's text, no path; the label resolves from it alone."""
    diff = make_diff(tmp_path / "clip16.diff", POLICY, CLIP)
    label = user.load(diff)
    data = user.shipped()
    diff.unlink()
    monkeypatch.setattr(user, "_loaded", {})
    monkeypatch.delenv(ARM_FILES_ENV, raising=False)
    with pytest.raises(UsageError, match="not loaded in this process"):
        user.lookup(label)
    user.install_shipped(data)
    assert user.lookup(label).arm.path == "" and user.lookup(label).targets == (
        "sglang.srt.managers.schedule_policy:CLIP_MAX_NEW_TOKENS",)


def test_a_process_started_from_here_finds_the_arm_by_its_label(tmp_path):
    """The TUI's replay child gets the label on its command line; the file comes from $SCHEDTRACE_ARM_FILES."""
    import io
    import os

    from schedtrace.tui.replay_child import read_frames

    label = user.load(make_diff(tmp_path / "clip16.diff", POLICY, CLIP))
    assert str(tmp_path / "clip16.diff") in os.environ[ARM_FILES_ENV].split(os.pathsep)
    trace = REPO / "traces" / "hybrid-swa-gptoss.trace"
    done = subprocess.run([sys.executable, "-m", "schedtrace.tui.replay_child", "stock", label, str(trace)],
                          capture_output=True, timeout=600)
    frames = dict(read_frames(io.BytesIO(done.stdout)))
    assert "failed" not in frames, frames.get("failed")
    assert frames["done"].new == label


def test_two_arms_that_change_one_function_alternate_without_leaking(tmp_path):
    """Old and new arm pass by pass, both editing _get_new_batch_prefill_raw: what leaves goes first."""
    from sglang.srt.managers.scheduler import Scheduler

    function = Scheduler._get_new_batch_prefill_raw
    stock = function.__code__
    edits = tmp_path / "latch_edits.py"
    edits.write_text("from schedtrace.arms.fixes import LATCH\nFIX = LATCH\n")
    label = user.load(edits)
    seen = {}
    for arm in ("latch", label, "latch", "stock", label, label, "stock"):
        with variants.applied(arm):
            seen.setdefault(arm, function.__code__)
            assert function.__code__ is seen[arm]
    assert seen["stock"] is stock and len({id(c) for c in seen.values()}) == 3
    assert function.__code__ is stock


def test_bisect_searches_user_arms_among_the_fixes(tmp_path):
    from loop_traces import latch_reproduction

    from schedtrace.replay.bisect import OPEN_LOOP, run_bisect

    latch_diff = tmp_path / "latch.diff"
    sections = re.split(r"(?=^diff --git )", BUILTIN_DIFF_PATH.read_text(), flags=re.M)
    latch_diff.write_text(next(s for s in sections if s.startswith("diff --git") and "/scheduler.py" in s.split("\n")[0]))
    label = user.load(latch_diff)
    report = run_bisect(latch_reproduction(tmp_path / "latch.trace"), modes=(OPEN_LOOP,),
                        fixes=f"chunk-cap,{latch_diff}")
    assert report.fixes == sorted(["chunk-cap", label])
    assert report.open_loop[0].fix_set == [label]


def test_labels_round_trip_with_the_fixes(tmp_path):
    label = user.load(make_diff(tmp_path / "clip16.diff", POLICY, CLIP))
    assert variants.variant_label(frozenset({"latch", label})) == f"latch,{label}"
    assert variants.variant_label(variants.parse_variant(f"fixed,{tmp_path / 'clip16.diff'}")) == f"fixed,{label}"
    assert variants.parse_variant(f"{label},latch") == {"latch", label}
    assert variants.canonical_variant(f"latch, {tmp_path / 'clip16.diff'}") == f"latch,{label}"
    assert user.file_spelling(f"latch,{label}") == "latch,./clip16.diff"
