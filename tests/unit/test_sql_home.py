"""``worker_cli/sql/`` is the one home of the SQL the package sends (issue 42):
no statement text elsewhere, no statement there that nothing uses, and every
statement returning jobs selects :data:`worker_cli.sql.JOB_COLUMNS` in order."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from worker_cli.sql import JOB_COLUMNS, UNIQUE_RESULT_COLUMNS

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "worker_cli"
HOME = PACKAGE / "sql"
#: Modules outside the home allowed to hold statement text: none (the
#: migration scripts are files of ``migrations/``, not strings).
ALLOWED: set[Path] = set()

#: The start of a statement in a string: the keywords the package's
#: statements begin with (a CTE's ``name as (`` too).
_STATEMENT = re.compile(
    r"^\s*(select|insert into|delete from|update|listen|unlisten|notify|set|reset|show"
    r"|savepoint|release savepoint|rollback to savepoint|discard|begin|commit"
    r"|with( recursive)? \w+ (\(.*\) )?as)\s"
)


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """The string constants of ``tree``, but docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes)
        if id(node) not in docstrings
    ]


def sql_outside_home(package: Path = PACKAGE) -> list[str]:
    """Every string outside ``worker_cli/sql/`` that is statement text: a
    template over the schema (``{schema}.``), or the start of a statement."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(package / "sql") or path in ALLOWED:
            continue
        for node in _strings(ast.parse(path.read_text())):
            text = node.value.decode() if isinstance(node.value, bytes) else node.value
            if "{schema}." in text or _STATEMENT.match(text):
                where = path.relative_to(package.parent)
                found.append(f"{where}:{node.lineno}: {text.strip()[:60]!r}")
    return found


def _statements() -> dict[tuple[str, str], object]:
    """The public statements of the home, by (module, name): its modules'
    upper-case constants holding a string or a table of strings."""
    found: dict[tuple[str, str], object] = {}
    for path in sorted(HOME.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(f"worker_cli.sql.{path.stem}")
        for name, value in vars(module).items():
            if not name.isupper() or name.startswith("_"):
                continue
            if isinstance(value, str) or (
                isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
            ):
                found[(path.stem, name)] = value
    return found


def _uses(package: Path) -> set[tuple[str, str]]:
    """The (module, name) of the home that the package's modules read: through
    an imported module (``from ..sql import fetch as fetch_sql``;
    ``fetch_sql.GET_JOBS``) or a name imported from one."""
    used: set[tuple[str, str]] = set()
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            module = node.module.split(".")
            if module[-1] == "sql" and (node.level or module[0] == "worker_cli"):
                for alias in node.names:
                    aliases[alias.asname or alias.name] = alias.name
            elif len(module) > 1 and module[-2] == "sql":
                for alias in node.names:
                    used.add((module[-1], alias.name))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                used.add((aliases[node.value.id], node.attr))
    return used


def dead_statements(package: Path = PACKAGE) -> list[str]:
    """The statements of the home that no module of the package uses."""
    used = _uses(package)
    return [
        f"sql/{module}.py: {name}" for module, name in _statements() if (module, name) not in used
    ]


def test_no_statement_text_outside_the_sql_home() -> None:
    assert sql_outside_home() == []


def test_every_statement_in_the_sql_home_is_used() -> None:
    assert dead_statements() == []


def _select_list(statement: str) -> list[str]:
    """The items of the statement's last top-level select list."""
    text = " ".join(statement.split())
    depth, last_select, items_end = 0, -1, len(text)
    for match in re.finditer(r"\(|\)|\bselect\b|\bfrom\b", text):
        token = match.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        elif depth == 0 and token == "select":
            last_select, items_end = match.end(), len(text)
        elif depth == 0 and token == "from" and last_select >= 0 and items_end == len(text):
            items_end = match.start()
    items, depth, start = [], 0, last_select
    for index in range(last_select, items_end):
        char = text[index]
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            items.append(text[start:index].strip())
            start = index + 1
    items.append(text[start:items_end].strip())
    return items


#: The statements that return job rows, and what their rows hold before the
#: job's columns.
RETURNING_JOBS: dict[tuple[str, str], tuple[str, ...]] = {
    ("jobs", "ADD_JOB"): (),
    ("jobs", "ADD_JOBS"): (),
    ("jobs", "REMOVE_JOB"): (),
    ("jobs", "COMPLETE_JOBS"): (),
    ("jobs", "PERMANENTLY_FAIL_JOBS"): (),
    ("jobs", "RESCHEDULE_JOBS"): (),
    ("jobs", "REMOVE_JOB_RELEASING_UNIQUE_LOCK"): (),
    ("jobs", "REMOVE_JOB_RECORDED"): (),
    ("jobs", "ADD_UNIQUE_JOB"): UNIQUE_RESULT_COLUMNS,
    ("jobs", "ADD_UNIQUE_JOBS"): UNIQUE_RESULT_COLUMNS,
    ("fetch", "LOST_FETCH_JOBS"): (),
    ("testing", "ADDED_JOBS"): (),
}


def _job_columns_at(items: list[str]) -> int | None:
    """Where a select list's job columns start (an ``x.id`` followed by an
    ``x.job_queue_id``), or None."""
    for index in range(len(items) - 1):
        if items[index].endswith(".id") and items[index + 1].endswith(".job_queue_id"):
            return index
    return None


def test_every_statement_returning_jobs_selects_job_columns_in_order() -> None:
    found = {}
    for key, statement in _statements().items():
        if isinstance(statement, str):
            start = _job_columns_at(_select_list(statement))
            if start is not None:
                found[key] = (_select_list(statement), start)
    assert set(found) == set(RETURNING_JOBS)
    for key, (items, start) in found.items():
        before = RETURNING_JOBS[key]
        assert [item.rpartition(".")[2] for item in items[:start]] == list(before), key
        row = items[start].rpartition(".")[0]
        assert items[start : start + len(JOB_COLUMNS)] == [f"{row}.{c}" for c in JOB_COLUMNS], key
