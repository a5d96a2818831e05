"""The package stays readable: bounded sizes and no import cycles.

Limits from the redesign (issue 14): no class longer than ~300 lines, no
function longer than ~80, no module longer than ~600, no import cycle
between modules (imports only for type checking do not count).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "worker_cli"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 600, 300, 80


def _modules() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _length(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def test_modules_classes_and_functions_are_short() -> None:
    too_long = []
    for name, path in _modules().items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE:
            too_long.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _length(node) > MAX_CLASS:
                too_long.append(f"class {name}.{node.name}: {_length(node)} lines")
            function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if function and _length(node) > MAX_FUNCTION:
                too_long.append(f"function {name}.{node.name}: {_length(node)} lines")
    assert not too_long, "\n".join(too_long)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports when it is imported
    (not those imported under ``if TYPE_CHECKING:``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for child in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom | ast.Import):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = node.module or ""
            root = f"{base}.{module}".strip(".") if node.level else module
            targets = [root] + [f"{root}.{alias.name}" for alias in node.names]
        found.update(target for target in targets if target in known and target != name)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for name in graph:
        graph[name] = {dep for dep in graph[name] if not name.startswith(dep + ".")}
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(cycles)
