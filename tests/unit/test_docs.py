"""The front page stays a front page, and points at pages that exist.

The docs site itself is checked by ``mkdocs build --strict`` in CI (links,
anchors, pages left out of the navigation); these checks need no MkDocs.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: At most this many lines (issue 43): what it is, install, the quickstart,
#: the test command and links; everything else is in docs/.
MOST_LINES = 250


def relative_links(text: str) -> list[str]:
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)\)", text)
        if not re.match(r"[a-z]+:|#", target)
    ]


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MOST_LINES, f"README.md has {len(lines)} lines, more than {MOST_LINES}"


def test_the_readme_links_to_files_that_exist() -> None:
    broken = [
        target
        for target in relative_links(README.read_text(encoding="utf-8"))
        if not (ROOT / target.split("#")[0]).exists()
    ]
    assert not broken, "README.md links to missing files: " + ", ".join(broken)


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = sorted(page for page in pages if f": {page}\n" not in nav)
    assert not missing, "pages not in mkdocs.yml's nav: " + ", ".join(missing)


def test_sphinx_roles_in_docstrings_are_shown_as_code_on_the_site() -> None:
    """The docs' hook (tools/docs_hooks.py, in mkdocs.yml's ``hooks``) turns
    a role as mkdocstrings renders it into the code alone, as Sphinx would."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    html = (
        "See :class:<code>Job</code>, :meth:<code>~worker_cli.WorkerUtils.add_job</code> "
        "and :py:func:<code>run</code>; a plain <code>x:y</code> stays."
    )
    assert hooks.on_page_content(html) == (
        "See <code>Job</code>, <code>add_job</code> and <code>run</code>; "
        "a plain <code>x:y</code> stays."
    )
    assert "tools/docs_hooks.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
