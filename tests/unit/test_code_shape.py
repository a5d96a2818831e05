"""The package stays readable: no import cycles, and layers.

No import cycle between modules, imports made only for type checking included
(issue 24). (The size caps of issue 14 were dropped by issue 42: modules are
shaped for their reader, not for a line count.) And the
subpackages are layers (their ``__init__.py`` docstrings say so): a module
imports only from its own subpackage, from the layers below it, and from
``errors`` and ``_version``; the entry points (``cli``, ``runner``, the public
``logs``, ``metrics`` and ``tracing`` modules, ``embedded``) sit on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "worker_cli"


#: The layers, bottom first. A module may import from its own subpackage and
#: from the layers below its own; worker and dashboard share a layer and
#: import neither each other nor anything above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sql",),
    ("config",),
    ("db",),
    ("schema",),
    ("jobs",),
    ("client",),
    ("tasks",),
    ("observe",),
    ("worker", "dashboard"),
)
#: Top-level modules any layer may import.
BASE = ("errors", "extras", "_version")


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports, anywhere in it (inside
    functions, and under ``if TYPE_CHECKING:`` too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom | ast.Import):
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


def _layer(name: str) -> int | None:
    """The layer of a module (None: a top-level entry point or base module)."""
    parts = name.split(".")
    if len(parts) < 3 and not (len(parts) == 2 and _is_package(parts[1])):
        return None
    for index, layer in enumerate(LAYERS):
        if parts[1] in layer:
            return index
    return None


def _is_package(part: str) -> bool:
    return any(part in layer for layer in LAYERS)


def layer_violations(package: Path = PACKAGE) -> list[str]:
    """Every import that goes against :data:`LAYERS`."""
    modules = _modules(package)
    root = package.name
    problems = []
    for name, path in modules.items():
        layer = _layer(name)
        if layer is None:
            continue
        own = name.split(".")[1]
        for dep in sorted(_imports(name, path, set(modules))):
            parts = dep.split(".")
            if dep == root or (len(parts) == 2 and parts[1] in BASE):
                continue
            if parts[1] == own:
                continue
            dep_layer = _layer(dep)
            if dep_layer is None or dep_layer >= layer:
                problems.append(f"{name} imports {dep}")
    return problems


def test_the_layers_hold() -> None:
    assert not layer_violations(), "\n".join(layer_violations())


def test_a_planted_violation_is_found(tmp_path: Path) -> None:
    package = tmp_path / "worker_cli"
    for folder in ("jobs", "worker", "observe"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("")
    (package / "cli.py").write_text("")
    (package / "worker" / "pool.py").write_text("from ..jobs import job\nfrom ..observe import x\n")
    (package / "jobs" / "job.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .. import errors\n"
        "if TYPE_CHECKING:\n    from ..worker.pool import Pool\n"
    )
    (package / "observe" / "x.py").write_text("def f():\n    from ..cli import main\n")
    assert layer_violations(package) == [
        "worker_cli.jobs.job imports worker_cli.worker.pool",
        "worker_cli.observe.x imports worker_cli.cli",
    ]


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
