"""Swap real functions' code for edited copies of their own source, and back.

A ``Fix`` is one or more ``SourceEdit``s, each naming one function by import
path with an exact old snippet and its replacement. ``prepare`` reads each
function's source with ``inspect.getsource``, checks the snippet, compiles the
edited source once in the function's own module globals and returns a
``PreparedFix`` whose ``apply``/``revert`` only assign ``__code__`` on every
edited function together. Assigning ``__code__`` (rather than rebinding a
name) is what makes every existing reference see the edit: bound methods,
``from x import f`` copies and hook wrappers alike.

The code here knows nothing about which fixes exist; ``schedtrace.arms.fixes`` does.
"""

from __future__ import annotations

import __future__

import ast
import enum
import importlib
import inspect
import textwrap
import types
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from schedtrace.tracer.contract.errors import FixMismatchError
from schedtrace.tracer.contract.versions import installed_version

# Compiler flags a module's ``from __future__`` imports put on its code objects.
_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


class EditStatus(enum.Enum):
    PATCHABLE = "patchable"  # the old snippet is there exactly once
    ALREADY_PRESENT = "already present"  # upstream already carries the new snippet


@dataclass(frozen=True)
class SourceEdit:
    """Replace ``old`` by ``new`` inside the function ``target``.

    ``target`` is ``"package.module:Qualified.name"``. Both snippets are
    written at any indentation; they are matched line by line at the
    indentation they have in the function.
    """

    target: str
    old: str
    new: str


@dataclass(frozen=True)
class Fix:
    """One named fix: its edits are applied and reverted together."""

    name: str
    edits: tuple[SourceEdit, ...]

    def __post_init__(self) -> None:
        if not self.edits:
            raise ValueError(f"fix {self.name!r} has no edits")


def check_one_edit_per_function(fixes: Iterable[Fix]) -> None:
    """Refuse two edits of one function (in one fix or two): each edit swaps
    the whole code object, so the second would silently undo the first."""
    owner: dict[str, str] = {}
    for fix in fixes:
        for edit in fix.edits:
            if edit.target in owner:
                raise ValueError(
                    f"{edit.target} is edited by both {owner[edit.target]!r} and {fix.name!r}; "
                    "combine them into one edit"
                )
            owner[edit.target] = fix.name


@dataclass(eq=False)
class PreparedEdit:
    """One edit, compiled once; ``apply``/``revert`` cost one attribute store."""

    edit: SourceEdit
    status: EditStatus
    function: types.FunctionType
    original: types.CodeType
    patched: types.CodeType

    def apply(self) -> None:
        self.function.__code__ = self.patched

    def revert(self) -> None:
        self.function.__code__ = self.original

    @property
    def is_applied(self) -> bool:
        return self.function.__code__ is self.patched


@dataclass(eq=False)
class PreparedFix:
    """All edits of one fix, compiled; switched on and off as one."""

    fix: Fix
    edits: tuple[PreparedEdit, ...]

    @property
    def status(self) -> EditStatus:
        # Already present only if upstream carries every edit; otherwise the
        # missing edits are applied (a present one patches to itself).
        if all(edit.status is EditStatus.ALREADY_PRESENT for edit in self.edits):
            return EditStatus.ALREADY_PRESENT
        return EditStatus.PATCHABLE

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(edit.edit.target for edit in self.edits)

    def apply(self) -> None:
        for edit in self.edits:
            edit.apply()

    def revert(self) -> None:
        for edit in self.edits:
            edit.revert()

    @property
    def is_applied(self) -> bool:
        return all(edit.is_applied for edit in self.edits)


def sglang_version() -> str:
    return installed_version("sglang")


def resolve(target: str) -> types.FunctionType:
    """The innermost plain function behind ``module:Qual.name``.

    Hook wrappers (sglang's plugin hooks use ``functools.wraps``) are unwrapped
    so the edit lands in the real function however many layers sit on top.
    """
    module_name, _, qualname = target.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        # __dict__ first: it sees staticmethod/classmethod objects unbound.
        obj = vars(obj).get(part, getattr(obj, part)) if isinstance(obj, type) else getattr(obj, part)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = inspect.unwrap(obj)
    if not isinstance(obj, types.FunctionType):
        raise TypeError(f"{target} is not a Python function: {type(obj).__name__}")
    return obj


def prepare(fix: Fix) -> PreparedFix:
    """Check every edit of ``fix`` against the installed code and compile it
    (no swap yet). The first edit that does not fit raises ``FixMismatchError``."""
    return PreparedFix(fix, tuple(prepare_edit(fix.name, edit) for edit in fix.edits))


def prepare_edit(fix: str, edit: SourceEdit) -> PreparedEdit:
    """Check one edit of the fix named ``fix`` and compile it (no swap yet)."""
    function = resolve(edit.target)
    original = function.__code__
    source = inspect.getsource(function)
    old_hits = find_block(source, edit.old)
    new_hits = find_block(source, edit.new)
    if new_hits:
        return PreparedEdit(edit, EditStatus.ALREADY_PRESENT, function, original, original)
    if len(old_hits) != 1:
        detail = (
            "the code to replace is not there"
            if not old_hits
            else f"the code to replace occurs {len(old_hits)} times, expected once"
        )
        raise FixMismatchError(fix, edit.target, sglang_version(), detail)
    # The unedited source must compile to exactly the loaded code; otherwise
    # the file changed since import and an edit of it would patch blind.
    if not same_code(compile_like(function, source), original):
        raise FixMismatchError(
            fix,
            edit.target,
            sglang_version(),
            "the source on disk does not compile to the loaded code",
        )
    edited = replace_block(source, edit.old, edit.new, old_hits[0])
    patched = compile_like(function, edited)
    return PreparedEdit(edit, EditStatus.PATCHABLE, function, original, patched)


def same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Byte-identical code, nested code objects compared the same way."""
    if a.co_code != b.co_code or a.co_names != b.co_names or a.co_varnames != b.co_varnames:
        return False
    if a.co_freevars != b.co_freevars or a.co_cellvars != b.co_cellvars:
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            if not same_code(x, y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


# --------------------------------------------------------------- snippets


def _block_lines(snippet: str) -> list[str]:
    return textwrap.dedent(snippet).strip("\n").splitlines()


def find_block(source: str, snippet: str) -> list[tuple[int, str]]:
    """(line index, indentation) of every place ``snippet`` occurs whole.

    A match is exact line by line after one common indentation prefix, so
    a snippet cannot match half a line or a differently nested copy.
    """
    block = _block_lines(snippet)
    if not block:
        raise ValueError("empty snippet")
    lines = source.splitlines()
    hits: list[tuple[int, str]] = []
    for start in range(len(lines) - len(block) + 1):
        first = lines[start]
        indent = first[: len(first) - len(first.lstrip())]
        if all(
            (lines[start + k].strip() == "" if not want.strip() else lines[start + k] == indent + want)
            for k, want in enumerate(block)
        ):
            hits.append((start, indent))
    return hits


def replace_block(source: str, old: str, new: str, hit: tuple[int, str]) -> str:
    start, indent = hit
    lines = source.splitlines()
    replacement = [indent + line if line.strip() else "" for line in _block_lines(new)]
    lines[start : start + len(_block_lines(old))] = replacement
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------ compilation


def compile_like(function: types.FunctionType, source: str) -> types.CodeType:
    """Compile ``source`` (one ``def``) into a code object ``function`` can take.

    It keeps the function's module globals, ``from __future__`` flags, file
    name, first line, qualified name and free variables (a method using
    ``super()`` closes over ``__class__``), and drops decorators, defaults and
    annotations: those live on the function object, which is not replaced.
    """
    original = function.__code__
    indented = source[:1].isspace()
    tree = ast.parse("if 1:\n" + source if indented else source)
    node = tree.body[0].body[0] if indented else tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"{function.__qualname__}: source is not a function definition")
    node.decorator_list = []
    node.returns = None
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg):
        if arg is not None:
            arg.annotation = None
    # Line numbers as in the file, so tracebacks point at the real source.
    ast.increment_lineno(node, original.co_firstlineno - node.lineno)

    body: list[ast.stmt] = [node]
    if original.co_freevars:
        # Give the def an enclosing scope that binds the same free names, so
        # the compiler makes them free variables, not globals.
        outer = ast.FunctionDef(
            name="__schedtrace_outer__",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=[
                *(
                    ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=ast.Constant(None))
                    for name in original.co_freevars
                ),
                node,
            ],
            decorator_list=[],
        )
        body = [outer]
    # The module's imports, compiled but never run: CPython emits different
    # (equivalent) bytecode for attribute calls on imported names.
    body = [*_module_imports(function.__module__), *body]
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    flags = original.co_flags & _FUTURE_FLAGS
    module_code = compile(module, original.co_filename, "exec", flags=flags, dont_inherit=True)
    code = _find_code(module_code, node.name)
    if code.co_freevars != original.co_freevars:
        raise TypeError(
            f"{function.__qualname__}: the edit changes the free variables "
            f"{original.co_freevars} -> {code.co_freevars}"
        )
    nested = inspect.CO_NESTED
    flags = (code.co_flags & ~nested) | (original.co_flags & nested)
    return code.replace(co_qualname=original.co_qualname, co_flags=flags)


@cache
def _module_imports(module_name: str) -> tuple[ast.stmt, ...]:
    """Import statements bound at module scope of ``module_name``."""
    import sys

    tree = ast.parse(inspect.getsource(sys.modules[module_name]))
    found: list[ast.stmt] = []

    def walk(statements: list[ast.stmt]) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.Import) or (
                isinstance(stmt, ast.ImportFrom) and stmt.module != "__future__"
            ):
                found.append(stmt)
            elif isinstance(stmt, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody"):
                    walk(getattr(stmt, field, []))
                for handler in getattr(stmt, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return tuple(found)


def _find_code(code: types.CodeType, name: str) -> types.CodeType:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name:
                return const
            if const.co_name == "__schedtrace_outer__":
                return _find_code(const, name)
    raise LookupError(name)
