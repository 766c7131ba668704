"""User arms: a unified diff of sglang's ``python/`` tree, or a module of source edits, as an arm.

An arm file is read once; it is named ``FILE@HASH`` (its file name and the
first ``ARM_DIGEST_CHARS`` hex digits of its bytes' sha256) wherever a report
names it. ``load`` checks it against the installed sglang's source text
without importing sglang (``unidiff`` applies a diff's hunks; an edits
module's snippets are found in their functions' text) and plans each patched
module (``overlay.plan_module``); ``prepare`` imports the modules and makes the
swaps. A file that does not apply fails here, in one line
(``ArmPatchError``), before any work.

An edits module declares ``FIXES`` (a list of ``Fix``), ``FIX`` (one) or
``EDITS`` (a list of ``SourceEdit``), in the form of ``schedtrace.arms.fixes``.

Other processes find an arm by its label: forked workers inherit the
registry; a process started from here (the TUI's replay, pytest) reads the
files named in ``$SCHEDTRACE_ARM_FILES``, which ``load`` keeps up to date; a
Ray worker is sent the arms' text (``shipped`` / ``install_shipped``).
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec

from schedtrace.arms import unidiff
from schedtrace.arms.overlay import Plan, PreparedPlan, plan_module, prepare_plan
from schedtrace.arms.patching import EditStatus, Fix, SourceEdit, find_block, replace_block
from schedtrace.tracer.contract.errors import ArmPatchError, UsageError
from schedtrace.tracer.contract.names import ARM_DIGEST_CHARS, ARM_FILES_ENV
from schedtrace.tracer.contract.versions import installed_version

DIFF, EDITS = "diff", "edits"
ARM_SUFFIXES = (".diff", ".patch", ".py")
_LABEL = re.compile(rf"^(?P<name>[^,@/]+)@(?P<digest>[0-9a-f]{{{ARM_DIGEST_CHARS}}})$")


class UserArm(msgspec.Struct, frozen=True):
    """An arm file's content, as it crosses to a worker."""

    name: str  # the file's name
    digest: str
    kind: str  # DIFF or EDITS
    text: str
    path: str = ""  # where this process read it ("" when it was sent)

    @property
    def label(self) -> str:
        return f"{self.name}@{self.digest}"


@dataclass(frozen=True)
class LoadedArm:
    """An arm checked against the installed source and planned (no sglang imported)."""

    arm: UserArm
    plans: tuple[Plan, ...]
    ignored: tuple[str, ...]  # diff files outside sglang's Python package

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for plan in self.plans for t in plan.targets)


@dataclass(eq=False)
class PreparedArm:
    """An arm's modules, swapped together (the interface of ``patching.PreparedFix``)."""

    loaded: LoadedArm
    plans: tuple[PreparedPlan, ...]

    @property
    def targets(self) -> tuple[str, ...]:
        return self.loaded.targets

    @property
    def status(self) -> EditStatus:
        if all(p.status is EditStatus.ALREADY_PRESENT for p in self.plans):
            return EditStatus.ALREADY_PRESENT
        return EditStatus.PATCHABLE

    def apply(self) -> None:
        for plan in self.plans:
            plan.apply()

    def revert(self) -> None:
        for plan in reversed(self.plans):
            plan.revert()

    @property
    def is_applied(self) -> bool:
        return all(p.is_applied for p in self.plans)


_loaded: dict[str, LoadedArm] = {}


def is_arm_path(token: str) -> bool:
    """Whether an arm token names a file (a fix name never has a slash or one of these suffixes)."""
    return "/" in token or os.sep in token or token.endswith(ARM_SUFFIXES) or Path(token).is_file()


def is_label(token: str) -> bool:
    return _LABEL.match(token) is not None


def read_arm(path: str | os.PathLike[str]) -> UserArm:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArmPatchError(str(path), "", f"cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ArmPatchError(str(path), "", "not UTF-8 text") from None
    digest = hashlib.sha256(data).hexdigest()[:ARM_DIGEST_CHARS]
    kind = EDITS if path.suffix == ".py" else DIFF
    return UserArm(path.name, digest, kind, text, str(path.resolve()))


# ------------------------------------------------------------------ planning


def _plan_diff(arm: UserArm) -> LoadedArm:
    patch = unidiff.collect(unidiff.parse_diff(arm.text, arm.name), arm.name)
    plans = []
    for relative, hunks in patch.files.items():
        display = f"python/sglang/{relative}"
        _, before = unidiff.read_installed(relative, arm.name)
        after, _ = unidiff.apply_hunks(before, hunks, arm.name, display)
        plans.append(plan_module(unidiff.module_name(relative), display, before, after, arm.name))
    return LoadedArm(arm, tuple(plans), patch.ignored)


def _declared_edits(arm: UserArm) -> list[SourceEdit]:
    namespace: dict = {"__name__": f"schedtrace_arm_{arm.digest}", "__file__": arm.path or arm.name}
    try:
        exec(compile(arm.text, arm.path or arm.name, "exec"), namespace)
    except Exception as exc:
        raise ArmPatchError(arm.name, "", f"the module raises {type(exc).__name__}: {exc}") from None
    found = namespace.get("FIXES", namespace.get("FIX", namespace.get("EDITS")))
    items = [found] if isinstance(found, (Fix, SourceEdit)) else list(found or ())
    edits = [e for item in items for e in (item.edits if isinstance(item, Fix) else (item,))]
    if not edits or not all(isinstance(e, SourceEdit) for e in edits):
        raise ArmPatchError(arm.name, "", "declares no FIXES, FIX or EDITS of schedtrace.arms.patching's Fix/SourceEdit")
    return edits


def _relative_of(module: str, arm: str) -> str:
    parts = module.split(".")
    if parts[0] != "sglang":
        raise ArmPatchError(arm, module, "not an sglang module")
    base = "/".join(parts[1:])
    root = unidiff.installed_root()
    return f"{base}/__init__.py" if (root / base / "__init__.py").is_file() else f"{base}.py"


def _function_node(tree: ast.Module, qualname: str) -> ast.stmt | None:
    body: list[ast.stmt] = tree.body
    node = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _edited_text(text: str, edits: list[tuple[int, SourceEdit]], arm: str, display: str) -> str:
    tree = ast.parse(text)
    lines = text.split("\n")
    replacements = []
    for k, edit in edits:
        qualname = edit.target.partition(":")[2]
        where = f"edit {k} ({edit.target})"
        node = _function_node(tree, qualname)
        if node is None:
            raise ArmPatchError(arm, where, f"no such function in {display} of sglang {installed_version('sglang')}")
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        segment = "\n".join(lines[start:node.end_lineno]) + "\n"
        if find_block(segment, edit.new):
            continue  # upstream already carries it
        hits = find_block(segment, edit.old)
        if len(hits) != 1:
            detail = "the code to replace is not there" if not hits else f"the code to replace occurs {len(hits)} times"
            raise ArmPatchError(arm, where, f"{detail} (sglang {installed_version('sglang')})")
        replaced = replace_block(segment, edit.old, edit.new, hits[0]).rstrip("\n").split("\n")
        replacements.append((start, node.end_lineno, replaced))
    for start, end, new in sorted(replacements, reverse=True):
        lines[start:end] = new
    return "\n".join(lines)


def _plan_edits(arm: UserArm) -> LoadedArm:
    by_module: dict[str, list[tuple[int, SourceEdit]]] = {}
    for k, edit in enumerate(_declared_edits(arm), 1):
        by_module.setdefault(edit.target.partition(":")[0], []).append((k, edit))
    plans = []
    for module, edits in by_module.items():
        relative = _relative_of(module, arm.name)
        display = f"python/sglang/{relative}"
        _, before = unidiff.read_installed(relative, arm.name)
        after = _edited_text(before, edits, arm.name, display)
        plans.append(plan_module(module, display, before, after, arm.name))
    return LoadedArm(arm, tuple(plans), ())


def plan_arm(arm: UserArm) -> LoadedArm:
    return _plan_diff(arm) if arm.kind == DIFF else _plan_edits(arm)


# ------------------------------------------------------------------ the registry


def _remember(path: str) -> None:
    known = [p for p in os.environ.get(ARM_FILES_ENV, "").split(os.pathsep) if p]
    if path and path not in known:
        os.environ[ARM_FILES_ENV] = os.pathsep.join([*known, path])


def load(path: str | os.PathLike[str]) -> str:
    """Read, check and plan the arm file at ``path`` (once per content); its label."""
    arm = read_arm(path)
    if arm.label not in _loaded:
        _loaded[arm.label] = plan_arm(arm)
    _remember(arm.path)
    return arm.label


def lookup(label: str) -> LoadedArm:
    """The loaded arm of ``label``: loaded here, sent here, or one of ``$SCHEDTRACE_ARM_FILES``."""
    if label in _loaded:
        return _loaded[label]
    name = _LABEL.match(label).group("name")
    for path in os.environ.get(ARM_FILES_ENV, "").split(os.pathsep):
        if path and Path(path).name == name and Path(path).is_file() and read_arm(path).label == label:
            load(path)
            return _loaded[label]
    raise UsageError(f"arm {label} is not loaded in this process: give its file's path instead "
                     f"(a file of that name with that content is not in ${ARM_FILES_ENV})")


def prepare(label: str) -> PreparedArm:
    """Import the arm's modules and make its swaps (no swap applied yet)."""
    loaded = lookup(label)
    return PreparedArm(loaded, tuple(prepare_plan(plan, loaded.arm.name, label) for plan in loaded.plans))


def shipped() -> bytes:
    """Every arm loaded here, text and all, for a worker that may not see the files."""
    return msgspec.msgpack.encode([loaded.arm for loaded in _loaded.values()])


def install_shipped(data: bytes) -> None:
    for arm in msgspec.msgpack.decode(data, type=list[UserArm]):
        if arm.label not in _loaded:
            _loaded[arm.label] = plan_arm(msgspec.structs.replace(arm, path=""))


def describe(label: str) -> str:
    """One line: the arm, its kind and what it changes."""
    loaded = lookup(label)
    files = ", ".join(plan.display for plan in loaded.plans) or "nothing"
    left = f"; left out (not sglang's Python package): {', '.join(loaded.ignored)}" if loaded.ignored else ""
    return f"{label}: {loaded.arm.kind} of {files}{left}"


def file_spelling(variant: str) -> str:
    """``variant`` with each user arm label as ``./FILE``: how ``SCHEDTRACE_FIXES`` names it beside the file."""
    return ",".join(f"./{_LABEL.match(t).group('name')}" if is_label(t) else t
                    for t in (part.strip() for part in variant.split(",")) if t)


def write_files(variant: str, folder: Path) -> list[Path]:
    """Each user arm of ``variant`` written into ``folder`` under its file name (for ``file_spelling``)."""
    written = []
    for token in (part.strip() for part in variant.split(",")):
        if is_label(token):
            arm = lookup(token).arm
            target = folder / arm.name
            target.write_text(arm.text, encoding="utf-8")
            written.append(target)
    return written

