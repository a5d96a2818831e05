"""The banner an action leaves on the next page, as the dashboard's tests read it."""

from __future__ import annotations

import html
import re

from dashboard_helpers import Reply


def banner(page: Reply) -> tuple[str, str, str] | None:
    """The page's banner: its outcome (``data-outcome``), its classes and its text."""
    found = re.search(
        r'<div class="([^"]*)"[^>]* id="notice" data-outcome="(\w+)">(.*?)</div>', page.body
    )
    if found is None:
        return None
    text = html.unescape(re.sub(r"<[^>]+>", "", found.group(3)))
    return found.group(2), found.group(1), text


def assert_refused(page: Reply, says: str) -> None:
    shown = banner(page)
    assert shown is not None, page.body[-800:]
    outcome, classes, text = shown
    assert outcome == "refused" and "notice-refused" in classes.split(), shown
    assert "notice-done" not in classes.split()
    assert text.startswith("Refused: ") and says in text, text
    assert 'role="alert"' in page.body


def assert_done(page: Reply, says: str) -> None:
    shown = banner(page)
    assert shown is not None, page.body[-800:]
    outcome, classes, text = shown
    assert outcome == "done" and "notice-done" in classes.split(), shown
    assert "notice-refused" not in classes.split()
    assert says in text and "Refused" not in text, text
