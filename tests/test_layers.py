"""The layers run one way (docs/architecture.md): this walks every import.

Each product module belongs to one room; a room may import only the rooms
listed for it. A new module lands in a room by its path, so the rule holds
without anyone remembering it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"schedtrace": "schedtrace", "tracer": "schedtrace.tracer", "arms": "schedtrace.arms",
           "replay": "schedtrace.replay", "tui": "schedtrace.tui"}

# room -> the rooms it may import (its own is always allowed). Longest prefix wins.
ROOMS: dict[str, set[str]] = {
    "schedtrace.tracer.contract": set(),
    "schedtrace.tracer.analysis": {"schedtrace.tracer.contract"},
    "schedtrace.tracer.kernel_stub": set(),
    "schedtrace.tracer.recorder": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis"},
    "schedtrace.tracer.export": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis"},
    # The arms (built-in fixes, user diffs, switching them): below everything that runs sglang.
    "schedtrace.arms": {"schedtrace.tracer.contract"},
    "schedtrace.tracer.sandbox": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis",
                                  "schedtrace.tracer.kernel_stub", "schedtrace.arms"},
    "schedtrace.replay": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis",
                          "schedtrace.tracer.kernel_stub", "schedtrace.arms"},
    # The sglang entry point: the one place that reaches the recorder and the live fixes.
    "schedtrace.tracer.plugin": {"schedtrace.tracer.contract", "schedtrace.tracer.recorder",
                                 "schedtrace.tracer.export", "schedtrace.arms"},
    "schedtrace.tui": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis", "schedtrace.replay",
                       "schedtrace.tracer.export", "schedtrace.arms"},
    "schedtrace.cli": {"schedtrace"},  # the top: anything (but schedtrace.testing)
    # Test support, apart from the product (as pytester): it may use the product; nothing imports it.
    "schedtrace.testing": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis", "schedtrace.tracer.recorder",
                           "schedtrace.tracer.sandbox", "schedtrace.replay"},
    # The package itself: the public API (docs/api.md), names imported on first use from the bottom rooms.
    "schedtrace": {"schedtrace.tracer.contract", "schedtrace.tracer.analysis"},
}


TEST_SUPPORT = "schedtrace.testing"


def room_of(module: str) -> str:
    matches = [r for r in ROOMS if module == r or module.startswith(r + ".")]
    if not matches:
        raise AssertionError(f"{module} is in no room: add it to ROOMS and docs/architecture.md")
    return max(matches, key=len)


def product_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return {n for n in found if n == "schedtrace" or n.startswith("schedtrace.")}


def allowed(source_room: str, target: str) -> bool:
    target_room = room_of(target) if target in MODULES or target_room_exists(target) else None
    if target_room is None:
        return True  # a name imported from a module, not a module itself
    if target_room == source_room:
        return True
    if target_room == TEST_SUPPORT:
        return False  # the product never depends on its test support
    return any(target == r or target.startswith(r + ".") for r in ROOMS[source_room])


def target_room_exists(name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in MODULES)


MODULES = product_modules()


def test_every_module_has_a_room() -> None:
    for module in MODULES:
        room_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module: str) -> None:
    source_room = room_of(module)
    bad = sorted(t for t in imports_of(module, MODULES[module]) if not allowed(source_room, t))
    assert not bad, f"{module} ({source_room}) imports upward or sideways: {', '.join(bad)}"


def test_the_checker_catches_an_upward_edge(tmp_path: Path) -> None:
    """The rule itself can fail: the contract importing the replayer is refused."""
    assert not allowed("schedtrace.tracer.contract", "schedtrace.replay.engine")
    assert not allowed("schedtrace.tracer.recorder", "schedtrace.replay.driver")
    assert allowed("schedtrace.tracer.plugin", "schedtrace.arms.variants")
    assert not allowed("schedtrace.tracer.plugin", "schedtrace.replay.driver")  # upward (replay.variants was the old edge)
    assert not allowed("schedtrace.tracer.plugin", "schedtrace.replay.engine")
    assert not allowed("schedtrace.arms", "schedtrace.replay.driver")
    assert not allowed("schedtrace.arms", "schedtrace.tracer.recorder")
    assert not allowed("schedtrace.cli", "schedtrace.testing.matrix")
    assert allowed("schedtrace.testing", "schedtrace.tracer.sandbox.server")


# ------------------------------------------------------------------ the guards

MAX_MODULE_LINES = 450  # a module past this holds more than one job: split it


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module: str) -> None:
    lines = MODULES[module].read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines (at most {MAX_MODULE_LINES}): split it by job"


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def load_time_imports(module: str, path: Path) -> set[str]:
    """The product modules ``module`` imports when it is itself imported (not in functions,
    not under ``if TYPE_CHECKING``): the edges an import loop is made of."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)) and not _is_type_checking(node):
            pending.extend(node.body)
            pending.extend(getattr(node, "orelse", []))
            pending.extend(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                pending.extend(handler.body)
    return {name for name in found if name in MODULES and name != module}


def import_loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                loops.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return loops


def test_no_import_loops() -> None:
    graph = {module: load_time_imports(module, path) for module, path in MODULES.items()}
    # a package's __init__ importing its own submodules is how a package exports them, not a loop
    for module, edges in graph.items():
        if MODULES[module].name == "__init__.py":
            edges -= {m for m in edges if m.startswith(module + ".")}
    assert import_loops(graph) == []


def test_the_loop_finder_finds_a_loop() -> None:
    assert import_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_loops({"a": {"b"}, "b": set()}) == []


def test_every_json_a_command_writes_has_its_struct_in_the_report_package() -> None:
    """A versioned Struct is a JSON a command writes: it lives in tracer/contract/report/, once."""
    pattern = re.compile(r"^class (\w+)\(msgspec\.Struct[^)]*\):\n(?:    .*\n|\n)*?    version: int = ", re.M)
    homes = {}
    for module, path in product_modules().items():
        for name in pattern.findall(path.read_text()):
            assert name not in homes, f"{name} twice: {homes[name]} and {module}"
            homes[name] = module
    assert {"Report", "SweepReport", "BisectReport", "RanksReport", "CheckReport"} <= set(homes)
    outside = {n: m for n, m in homes.items() if not m.startswith("schedtrace.tracer.contract.report.")}
    assert not outside, outside
