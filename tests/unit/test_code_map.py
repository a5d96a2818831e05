"""The code map (docs/internals/code-map.md, "How the code is organised")
names every package and module of ``worker_cli``, and names none that is gone.

A module is named by its path below ``worker_cli/`` in backquotes
(``worker/pipeline/fetcher.py``), a package by its folder (``worker/pipeline/``);
a row may name several.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "worker_cli"
CODE_MAP = ROOT / "docs" / "internals" / "code-map.md"


def code_map() -> str:
    return CODE_MAP.read_text(encoding="utf-8")


def named(text: str) -> set[str]:
    """Every path in backquotes that looks like a module or a folder of ours."""
    return {
        found
        for found in re.findall(r"`([\w/]+(?:\.py|/))`", text)
        if not found.startswith(("tests/", "migrations/", "tools/", "bench/"))
    }


def modules() -> set[str]:
    """The package's modules and packages, as the code map names them."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py":
            if relative.parent != Path("."):
                found.add(relative.parent.as_posix() + "/")
        else:
            found.add(relative.as_posix())
    return found


def test_every_module_and_package_is_in_the_code_map() -> None:
    missing = sorted(modules() - named(code_map()))
    assert not missing, "not in the code map (docs/internals/code-map.md): " + ", ".join(missing)


def test_the_code_map_names_nothing_that_is_gone() -> None:
    gone = sorted(name for name in named(code_map()) if not (PACKAGE / name).exists())
    assert not gone, "named by the code map but not in worker_cli: " + ", ".join(gone)
