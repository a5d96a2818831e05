"""The tests stay laid out by tier and area (README, "Development"): every
test module in one of the folders, none at the top of ``tests/``, and no test
module importing another (what tests share is in ``tests/support/`` or a
``conftest.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
FOLDERS = {"unit", "db", "dashboard", "compat", "system", "django_tasks"}


def _test_modules() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_module_is_in_a_tier_or_area_folder() -> None:
    astray = [
        str(path.relative_to(TESTS))
        for path in _test_modules()
        if path.relative_to(TESTS).parts[0] not in FOLDERS
    ]
    assert not astray, f"not in {sorted(FOLDERS)}: {astray}"


def test_no_test_module_imports_another() -> None:
    found = []
    for path in _test_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.relative_to(TESTS)}: {name}" for name in names if name.startswith("test_")
            ]
    assert not found, "\n".join(found)
