"""The four built-in fixes as one unified diff, as an sglang PR would carry them.

``arms/builtin-fixes.diff`` (installed beside this module) is
``render_builtin_diff()`` against the pinned sglang: ``git diff``'s layout,
``a/python/sglang/...`` and ``b/python/sglang/...``. ``--new
<that file>`` replays as ``--new fixed`` does (tests/test_user_arms.py checks
every sample trace); tests/test_user_arms.py also checks the file is what
the fixes render to, so the two never drift. Regenerate it with
``python -m schedtrace.arms.shipped``.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from schedtrace.arms import unidiff
from schedtrace.arms.fixes import FIXES
from schedtrace.arms.user import _edited_text, _relative_of
from schedtrace.tracer.contract.names import BUILTIN_DIFF

BUILTIN_DIFF_PATH = Path(__file__).with_name(BUILTIN_DIFF)


def render_builtin_diff() -> str:
    """The four fixes' edits applied to the installed files' text, as one diff (no sglang import)."""
    by_module: dict[str, list] = {}
    for k, edit in enumerate((e for fix in FIXES.values() for e in fix.edits), 1):
        by_module.setdefault(edit.target.partition(":")[0], []).append((k, edit))
    out: list[str] = []
    for module in sorted(by_module):
        relative = _relative_of(module, BUILTIN_DIFF)
        display = f"python/sglang/{relative}"
        _, before = unidiff.read_installed(relative, BUILTIN_DIFF)
        after = _edited_text(before, by_module[module], BUILTIN_DIFF, display)
        out.append(f"diff --git a/{display} b/{display}\n")
        out += difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                    f"a/{display}", f"b/{display}", n=3)
    return "".join(out)


if __name__ == "__main__":
    BUILTIN_DIFF_PATH.write_text(render_builtin_diff())
    print(BUILTIN_DIFF_PATH)
