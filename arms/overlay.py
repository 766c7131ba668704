"""A patched sglang module as bindings swapped in and out of the loaded one.

Why this and not the patched files imported in place of the originals (an
overlay on ``sys.path``, or the modules executed again): the open-loop replay
runs the old and the new arm alternately in one process, pass by pass, so an
arm must turn on and off in microseconds and revert exactly; and a module run
again would run again everything it does at import (registries, hooks, the
classes every live object is an instance of), leaking into the other arm.

So the two texts are compared statement by statement (``plan_module``: pure,
``ast`` only, no sglang import), at module level and inside each class:

* a function both sides define, with the same decorators, is a **code swap**:
  its new code object (from compiling the whole patched file, so line
  numbers, ``__future__`` flags and ``super()``'s ``__class__`` cell are as
  in the file) is assigned to the loaded function's ``__code__``, and its
  defaults when they changed; every reference (bound methods, ``from x
  import f`` copies, sglang's hook wrappers, unwrapped) sees it;
* anything else that binds a name (a constant, a class attribute, a new
  helper or class, a function whose decorators changed, an import) is a
  **binding swap**: the new statement is run once against the module's own
  globals (bindings captured, then put back), and its value is swapped into
  the module's or the class's namespace, and into the modules that copied
  the old value with ``from module import NAME``;
* a statement the diff leaves alone but that reads a changed name when the
  module is imported (``TABLE = [0] * SIZE``, a default ``x=SIZE``, a class
  attribute) is run again too, so a constant read at import takes effect;
* a name the diff removes is deleted while the arm is on.

A new statement that binds nothing (a top-level call) is refused: its effect
could not be undone. Changing a class's bases or decorators is refused. The
loaded code is checked against the file on disk first (each swapped
function's original compiles to exactly the loaded code object).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import linecache
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from schedtrace.arms.patching import EditStatus, same_code
from schedtrace.tracer.contract.errors import ArmPatchError

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
CODE, BIND, UNBIND = "code", "bind", "unbind"
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Change:
    owner: tuple[tuple[str, int, int], ...]  # enclosing classes: (name, first line old, first line new)
    name: str
    kind: str  # CODE, BIND or UNBIND
    node: ast.stmt | None = None  # the patched statement (CODE, BIND)
    old_line: int = 0  # CODE: the def's first line on each side
    new_line: int = 0
    code_changed: bool = True  # CODE: False when only the defaults are evaluated again
    defaults: bool = False
    accessor: str = ""  # CODE on a property: fget, fset or fdel

    @property
    def qualname(self) -> str:
        return ".".join([*(o[0] for o in self.owner), self.name])


@dataclass(frozen=True)
class Plan:
    module: str
    display: str  # python/sglang/... as errors name it
    old_text: str
    new_text: str
    changes: tuple[Change, ...]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f"{self.module}:{c.qualname}" for c in self.changes))


# ------------------------------------------------------------------ planning (pure)


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _accessor(node: ast.stmt) -> str:
    for d in getattr(node, "decorator_list", []):
        if isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter"):
            return "fset" if d.attr == "setter" else "fdel"
        if isinstance(d, ast.Name) and d.id == "property":
            return "fget"
    return ""


def _key(node: ast.stmt) -> tuple:
    if isinstance(node, _DEFS):
        return ("def", node.name, _accessor(node))
    if isinstance(node, ast.ClassDef):
        return ("class", node.name)
    if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
        return ("bind", tuple(t.id for t in node.targets))
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return ("bind", (node.target.id,))
    return ("stmt", ast.dump(node))


def _keyed(body: list[ast.stmt]) -> list[tuple[tuple, ast.stmt]]:
    seen: dict[tuple, int] = {}
    out = []
    for k, node in enumerate(body):
        if k == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        key = _key(node)
        seen[key] = seen.get(key, 0) + 1
        out.append(((*key, seen[key]), node))
    return out


def bound_names(node: ast.stmt) -> set[str]:
    """The names a statement binds in its own scope (not inside the functions or classes it defines)."""
    if isinstance(node, (*_DEFS, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif isinstance(child, ast.stmt):
            names |= bound_names(child)
        elif isinstance(child, (ast.expr, ast.excepthandler, ast.withitem, ast.comprehension, ast.arguments)):
            if isinstance(child, ast.excepthandler) and child.name:
                names.add(child.name)
            names |= {n.id for n in ast.walk(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


def import_time_loads(node: ast.AST) -> set[str]:
    """Names a statement reads when the module is imported (not inside function bodies)."""
    if isinstance(node, _DEFS):
        parts = [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        return set().union(*(import_time_loads(p) for p in parts))
    if isinstance(node, ast.Lambda):
        return set().union(*(import_time_loads(p) for p in node.args.defaults))
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Load) else set()
    return set().union(*(import_time_loads(c) for c in ast.iter_child_nodes(node)))


def _defaults_dump(node: ast.stmt) -> str:
    return ast.dump(ast.Tuple([*node.args.defaults, *(d or ast.Constant(None) for d in node.args.kw_defaults)]))


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _diff_body(old: list[ast.stmt], new: list[ast.stmt], owner: tuple, outer: set[str],
               out: list[Change], fail) -> None:
    old_map = dict(_keyed(old))
    new_keyed = _keyed(new)
    changed: set[str] = set()
    bound_new: set[str] = set()
    for key, node in new_keyed:
        bound_new |= bound_names(node)
        before = old_map.get(key)
        dirty = bool(import_time_loads(node) & (changed | outer))
        if isinstance(node, ast.ClassDef) and before is not None:
            if not (_same(ast.Tuple([*before.bases, *before.decorator_list]), ast.Tuple([*node.bases, *node.decorator_list]))
                    and all(_same(x, y) for x, y in zip(before.keywords, node.keywords))
                    and len(before.keywords) == len(node.keywords)):
                fail(f"class {'.'.join([*(o[0] for o in owner), node.name])}: "
                     "the change touches its bases or decorators, which an arm cannot swap")
            if not _same(before, node) or dirty:
                inner = (*owner, (node.name, _first_line(before), _first_line(node)))
                _diff_body(before.body, node.body, inner, changed | outer, out, fail)
            continue
        if isinstance(node, _DEFS) and before is not None:
            same_decorators = _same(ast.Tuple(before.decorator_list), ast.Tuple(node.decorator_list))
            decorators_dirty = bool(set().union(*(import_time_loads(d) for d in node.decorator_list)) & (changed | outer))
            if same_decorators and not decorators_dirty:
                code_changed = not _same(before, node)
                defaults = _defaults_dump(before) != _defaults_dump(node) or dirty
                if code_changed or defaults:
                    out.append(Change(owner, node.name, CODE, node, _first_line(before), _first_line(node),
                                      code_changed, defaults, _accessor(node)))
                continue
        if before is not None and _same(before, node) and not dirty:
            continue
        names = bound_names(node)
        if not names:
            harmless = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)  # a string moved
            if before is None and key[0] == "stmt" and not harmless:
                fail(f"line {node.lineno}: a new statement that binds no name; its effect could not be undone")
            continue  # an unchanged statement, or an import the diff moved
        changed |= names
        for name in sorted(names):
            out.append(Change(owner, name, BIND, node))
    new_keys = {k for k, _ in new_keyed}
    gone = set().union(*(bound_names(n) for k, n in old_map.items() if k not in new_keys)) - bound_new
    for name in sorted(gone):
        out.append(Change(owner, name, UNBIND))


def plan_module(module: str, display: str, old_text: str, new_text: str, arm: str) -> Plan:
    """What swapping ``new_text`` in for the loaded ``old_text`` of ``module`` changes; no import."""
    def fail(detail: str) -> None:
        raise ArmPatchError(arm, display, detail)

    try:
        old_tree = ast.parse(old_text)
    except SyntaxError as exc:
        raise ArmPatchError(arm, display, f"the installed file does not parse: {exc.msg}") from None
    try:
        new_tree = ast.parse(new_text)
    except SyntaxError as exc:
        raise ArmPatchError(arm, display, f"the patched file does not parse: line {exc.lineno}: {exc.msg}") from None
    changes: list[Change] = []
    _diff_body(old_tree.body, new_tree.body, (), set(), changes, fail)
    return Plan(module, display, old_text, new_text, tuple(changes))


# ------------------------------------------------------------------ preparing (imports the module)


def _find_code(code: types.CodeType, path: list[tuple[str, int]]) -> types.CodeType | None:
    name, line = path[0]
    for const in code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == name and const.co_firstlineno == line:
            return const if len(path) == 1 else _find_code(const, path[1:])
    return None


def _function(obj: Any, accessor: str) -> types.FunctionType | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = getattr(obj, accessor or "fget")
    obj = inspect.unwrap(obj) if obj is not None else None
    return obj if isinstance(obj, types.FunctionType) else None


@dataclass(eq=False)
class _Swap:
    function: types.FunctionType
    old: tuple[types.CodeType, Any, Any]
    new: tuple[types.CodeType, Any, Any]

    def set(self, value: tuple[types.CodeType, Any, Any]) -> None:
        self.function.__code__, self.function.__defaults__, self.function.__kwdefaults__ = value


@dataclass(eq=False)
class _Binding:
    namespace: Any  # a module or a class
    name: str
    old: Any
    new: Any

    def set(self, value: Any) -> None:
        if value is MISSING:
            if self.name in vars(self.namespace):
                delattr(self.namespace, self.name)
        else:
            setattr(self.namespace, self.name, value)

    def current(self) -> Any:
        return vars(self.namespace).get(self.name, MISSING)


@dataclass(eq=False)
class PreparedPlan:
    """One module's changes, made objects; ``apply``/``revert`` only assign attributes."""

    plan: Plan
    swaps: list[_Swap] = field(default_factory=list)
    bindings: list[_Binding] = field(default_factory=list)

    def apply(self) -> None:
        for swap in self.swaps:
            swap.set(swap.new)
        for binding in self.bindings:
            binding.set(binding.new)

    def revert(self) -> None:
        for binding in reversed(self.bindings):
            binding.set(binding.old)
        for swap in self.swaps:
            swap.set(swap.old)

    @property
    def is_applied(self) -> bool:
        return (all(s.function.__code__ is s.new[0] for s in self.swaps)
                and all(b.current() is b.new for b in self.bindings))

    @property
    def status(self) -> EditStatus:
        return EditStatus.PATCHABLE if self.swaps or self.bindings else EditStatus.ALREADY_PRESENT


def _eval(expr: ast.expr, filename: str, globals_: dict, locals_: dict) -> Any:
    return eval(compile(ast.Expression(expr), filename, "eval", dont_inherit=True), globals_, locals_)


def _defaults(node: ast.stmt, filename: str, globals_: dict, locals_: dict) -> tuple[Any, Any]:
    args = node.args
    defaults = tuple(_eval(d, filename, globals_, locals_) for d in args.defaults) or None
    kw = {a.arg: _eval(d, filename, globals_, locals_) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    return defaults, kw or None


def _future_imports(text: str) -> list[ast.stmt]:
    return [n for n in ast.parse(text).body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]


def _run_captured(stmt: ast.stmt, futures: list[ast.stmt], filename: str, globals_: dict) -> dict[str, Any]:
    """Run one module-level statement against ``globals_``; its new bindings, with ``globals_`` put back."""
    code = compile(ast.fix_missing_locations(ast.Module([*futures, stmt], [])), filename, "exec", dont_inherit=True)
    names = bound_names(stmt)
    before = {n: globals_.get(n, MISSING) for n in names}
    try:
        exec(code, globals_)
        return {n: globals_.get(n, MISSING) for n in names}
    finally:
        for n, value in before.items():
            if value is MISSING:
                globals_.pop(n, None)
            else:
                globals_[n] = value


def _class_def(stmt: ast.stmt, new_code: types.CodeType, cls: type, filename: str, globals_: dict) -> Any:
    """A method defined anew (a new one, or its decorators changed), closed over ``cls`` as ``super()`` needs."""
    ns = dict(vars(cls))
    closure = tuple(types.CellType(cls) for _ in new_code.co_freevars) if new_code.co_freevars == ("__class__",) else None
    if new_code.co_freevars and closure is None:
        raise TypeError(f"free variables {new_code.co_freevars}")
    function = types.FunctionType(new_code, globals_, stmt.name, None, closure)
    function.__defaults__, function.__kwdefaults__ = _defaults(stmt, filename, globals_, ns)
    value: Any = function
    for decorator in reversed(stmt.decorator_list):
        value = _eval(decorator, filename, globals_, ns)(value)
    return value


_IMPORT_FROM = "from\\s+({module}|\\.+{last}|\\.+)\\s+import\\s+(\\([^)]*\\)|[^\\n]*)"


def _copies(module: str, name: str, old: Any) -> list[Any]:
    """Modules that hold ``old`` under ``name`` because they imported it from ``module``."""
    last = module.rpartition(".")[2]
    pattern = re.compile(_IMPORT_FROM.format(module=re.escape(module), last=re.escape(last)))
    found = []
    for other_name, other in list(sys.modules.items()):
        if other is None or other_name == module or vars(other).get(name, MISSING) is not old:
            continue
        try:
            text = inspect.getsource(other)
        except (OSError, TypeError):
            continue
        if any(re.search(rf"\b{re.escape(name)}\b", m.group(2)) for m in pattern.finditer(text)):
            found.append(other)
    return found


def prepare_plan(plan: Plan, arm: str, label: str) -> PreparedPlan:
    """Import the module, check it is the file on disk, and make every change's new object."""
    def fail(change: Change, detail: str) -> ArmPatchError:
        return ArmPatchError(arm, f"{plan.display} ({change.qualname})", detail)

    module = importlib.import_module(plan.module)
    filename = module.__file__ or plan.display
    patched_name = f"{filename} [{label}]"  # tracebacks show the patched lines
    lines = plan.new_text.splitlines(keepends=True)
    linecache.cache[patched_name] = (len(plan.new_text), None, lines, patched_name)
    old_code = compile(plan.old_text, filename, "exec", dont_inherit=True)
    new_code = compile(plan.new_text, patched_name, "exec", dont_inherit=True)
    futures = _future_imports(plan.new_text)
    out = PreparedPlan(plan)
    for change in plan.changes:
        owner: Any = module
        for name, _, _ in change.owner:
            owner = vars(owner).get(name, MISSING)
            if not isinstance(owner, type):
                raise fail(change, f"class {name} is not loaded as a class")
        globals_ = vars(module)
        if change.kind == UNBIND:
            out.bindings.append(_Binding(owner, change.name, vars(owner).get(change.name, MISSING), MISSING))
            continue
        if change.kind == CODE:
            function = _function(vars(owner).get(change.name), change.accessor)
            if function is None:
                raise fail(change, "not a Python function in the loaded module")
            old_path = [*((o[0], o[1]) for o in change.owner), (change.name, change.old_line)]
            new_path = [*((o[0], o[2]) for o in change.owner), (change.name, change.new_line)]
            was, will = _find_code(old_code, old_path), _find_code(new_code, new_path)
            if was is None or will is None or not same_code(was, function.__code__):
                raise fail(change, "the source on disk does not compile to the loaded code")
            if will.co_freevars != function.__code__.co_freevars:
                raise fail(change, f"the change makes its free variables {will.co_freevars}, "
                                   f"not {function.__code__.co_freevars}; an arm cannot swap that")
            new = (will if change.code_changed else function.__code__, function.__defaults__, function.__kwdefaults__)
            if change.defaults:
                ns = {} if owner is module else dict(vars(owner))
                new = (new[0], *_defaults(change.node, patched_name, globals_, ns))
            out.swaps.append(_Swap(function, (function.__code__, function.__defaults__, function.__kwdefaults__), new))
            continue
        old_value = vars(owner).get(change.name, MISSING)
        try:
            if owner is module:
                value = _run_captured(change.node, futures, patched_name, globals_)[change.name]
            elif isinstance(change.node, _DEFS):
                path = [*((o[0], o[2]) for o in change.owner), (change.name, _first_line(change.node))]
                value = _class_def(change.node, _find_code(new_code, path), owner, patched_name, globals_)
            else:
                ns = dict(vars(owner))
                exec(compile(ast.fix_missing_locations(ast.Module([*futures, change.node], [])), patched_name,
                             "exec", dont_inherit=True), globals_, ns)
                value = ns.get(change.name, MISSING)
        except ArmPatchError:
            raise
        except Exception as exc:  # the patched statement itself fails: the arm's problem, said in one line
            raise fail(change, f"the patched statement raises {type(exc).__name__}: {exc}") from None
        out.bindings.append(_Binding(owner, change.name, old_value, value))
        if owner is module and old_value is not MISSING:
            for other in _copies(plan.module, change.name, old_value):
                out.bindings.append(_Binding(other, change.name, old_value, value))
    return out
