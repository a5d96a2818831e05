"""MkDocs hooks for the documentation site (``hooks:`` in mkdocs.yml).

The package's docstrings name other objects with Sphinx roles
(``:class:`Job```, ``:meth:`~WorkerUtils.add_job```), which mkdocstrings
renders as the role's text beside the code. :func:`strip_roles` leaves the
code alone, as Sphinx shows it: ``~`` keeps the last dotted part only.
"""

from __future__ import annotations

import re
from typing import Any

#: A role as mkdocstrings renders it: ``:class:<code>Job</code>``.
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):<code>(.*?)</code>")


def _shown(match: re.Match[str]) -> str:
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def strip_roles(html: str) -> str:
    """The page's HTML with each rendered Sphinx role reduced to its code."""
    return _ROLE.sub(_shown, html)


def on_page_content(html: str, **kwargs: Any) -> str:
    """MkDocs' hook: every page's HTML, after Markdown (and mkdocstrings)."""
    return strip_roles(html)
