"""Unified diffs of sglang's Python files: parse, map to the installed tree, apply to its text.

``git diff`` and ``git format-patch`` of an sglang PR name files
``a/python/sglang/...`` and ``b/python/sglang/...``; ``--no-prefix`` drops the
``a/``/``b/``, and a diff taken between two installed trees names them
``.../site-packages/sglang/...`` or ``sglang/...``. Every one of these is
mapped to the installed package by the path after its ``sglang/`` component
(``installed_root``: found without importing sglang). Files outside the
package (tests, docs, the kernels) do not run in the scheduler: they are
left out and listed (``Patch.ignored``).

Hunks apply to the installed text exactly (no fuzz), at the line the hunk
names or, as ``patch`` does, the nearest line where its whole old side
matches, after the previous hunk. A hunk whose new side is already there
(upstream carries the change) is skipped. Anything else fails in one line
naming the arm, the file and the hunk (``ArmPatchError``): the context is not
there (another sglang release, or an edited tree), the file is missing, or
the diff creates, deletes or renames a file.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from schedtrace.tracer.contract.errors import ArmPatchError
from schedtrace.tracer.contract.versions import installed_version

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
DEV_NULL = "/dev/null"


@dataclass(frozen=True)
class Hunk:
    header: str  # the "@@ -a,b +c,d @@" line, as the error names it
    old_start: int  # 1-based
    lines: tuple[str, ...]  # each with its ' ', '-' or '+' prefix

    @property
    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass(frozen=True)
class FileDiff:
    old_path: str
    new_path: str
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    """The files of a diff the arm changes (sglang-relative path -> hunks) and those left out."""

    files: dict[str, tuple[Hunk, ...]]
    ignored: tuple[str, ...]


def _path(raw: str) -> str:
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    return path


def parse_diff(text: str, arm: str) -> list[FileDiff]:
    """The file sections of a unified diff (git's extended headers and a format-patch mail around them ignored)."""
    lines = text.splitlines()
    files: list[FileDiff] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_path, new_path = _path(line[4:]), _path(lines[i + 1][4:])
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and (m := _HUNK.match(lines[i])):
            header = lines[i]
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            body: list[str] = []
            i += 1
            while (old_left > 0 or new_left > 0) and i < len(lines):
                raw = lines[i]
                tag = raw[:1] or " "  # an empty line: a blank context line whose space was stripped
                if tag == "\\":  # "\ No newline at end of file"
                    i += 1
                    continue
                if tag not in " -+":
                    raise ArmPatchError(arm, f"{new_path} {header}", f"line {i + 1} of the diff is not part of the hunk")
                body.append(tag + raw[1:])
                old_left -= tag in " -"
                new_left -= tag in " +"
                i += 1
            if old_left > 0 or new_left > 0:
                raise ArmPatchError(arm, f"{new_path} {header}", "the diff ends inside this hunk")
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            hunks.append(Hunk(header, int(m.group(1)), tuple(body)))
        files.append(FileDiff(old_path, new_path, tuple(hunks)))
    if not files and "GIT binary patch" not in text:
        raise ArmPatchError(arm, "", "not a unified diff (no '--- a/...' / '+++ b/...' file headers)")
    return files


def sglang_relative(path: str) -> str | None:
    """``srt/managers/scheduler.py`` for any spelling of that file's path, or None outside the package."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if parts and parts[0] in ("a", "b") and "sglang" in parts[1:]:
        parts = parts[1:]
    for k, part in enumerate(parts[:-1]):
        if part == "sglang":
            return "/".join(parts[k + 1:])
    return None


@cache
def installed_root() -> Path:
    """The installed ``sglang`` package's folder, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ArmPatchError("sglang", "", "not installed here: an arm needs the sglang it patches")
    return Path(list(spec.submodule_search_locations)[0])


def module_name(relative: str) -> str:
    """``sglang.srt.managers.scheduler`` for ``srt/managers/scheduler.py``."""
    parts = ["sglang", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def collect(files: list[FileDiff], arm: str) -> Patch:
    """The sglang Python files the diff changes, its other files left out; refuses creating or deleting."""
    changed: dict[str, list[Hunk]] = {}
    ignored: list[str] = []
    for f in files:
        name = f.new_path if f.new_path != DEV_NULL else f.old_path
        relative = sglang_relative(name)
        if relative is None or not relative.endswith(".py"):
            ignored.append(name)
            continue
        display = f"python/sglang/{relative}"
        if f.old_path == DEV_NULL:
            raise ArmPatchError(arm, display, "the diff creates this file; an arm can only edit files sglang has")
        if f.new_path == DEV_NULL:
            raise ArmPatchError(arm, display, "the diff deletes this file; an arm can only edit files sglang has")
        if sglang_relative(f.old_path) != relative:
            raise ArmPatchError(arm, display, f"the diff renames {f.old_path}; an arm can only edit files in place")
        changed.setdefault(relative, []).extend(f.hunks)
    return Patch({k: tuple(v) for k, v in changed.items()}, tuple(ignored))


def _matches(lines: list[str], at: int, block: list[str]) -> bool:
    return at >= 0 and at + len(block) <= len(lines) and lines[at:at + len(block)] == block


def _nearest(lines: list[str], block: list[str], want: int, lo: int) -> int | None:
    """The match of ``block`` nearest line ``want``, at ``lo`` or after."""
    for delta in range(len(lines) + 1):
        for at in (want - delta, want + delta) if delta else (want,):
            if at >= lo and _matches(lines, at, block):
                return at
    return None


def apply_hunks(text: str, hunks: tuple[Hunk, ...], arm: str, display: str) -> tuple[str, int]:
    """``text`` with every hunk applied, and how many were already there; the first that fits nowhere raises."""
    lines = [line.rstrip("\r") for line in text.split("\n")]
    offset = 0  # lines the hunks so far added
    lo = 0  # a hunk applies after the one before it
    present = 0
    for k, hunk in enumerate(hunks, 1):
        old, new = hunk.old, hunk.new
        want = max(hunk.old_start - 1 + offset, 0) if old else hunk.old_start + offset
        at = _nearest(lines, old, want, lo) if old else min(want, len(lines))
        if at is None:
            if new and _nearest(lines, new, want, lo) is not None:
                present += 1
                continue
            raise ArmPatchError(
                arm, f"{display} hunk {k} ({hunk.header})",
                f"the context is not in the installed sglang {installed_version('sglang')} "
                "(another release, or the file was edited)",
            )
        lines[at:at + len(old)] = new
        offset += len(new) - len(old)
        lo = at + len(new)
    return "\n".join(lines), present


def read_installed(relative: str, arm: str) -> tuple[Path, str]:
    path = installed_root() / relative
    try:
        return path, path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArmPatchError(arm, f"python/sglang/{relative}",
                            f"no such file in the installed sglang {installed_version('sglang')}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ArmPatchError(arm, f"python/sglang/{relative}", f"cannot read it: {exc}") from None
