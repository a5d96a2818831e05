"""The dashboard's tests: ``url``, a served dashboard of the test's database,
its pages not refreshing themselves (a test module that needs other options
defines its own ``url``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dashboard_helpers import dashboard


@pytest.fixture
def url(db: str) -> Iterator[str]:
    """The base URL of ``db``'s dashboard (``create_app`` with the tests' CSRF
    secret, ``refresh=0``), served for the test."""
    with dashboard(db, refresh=0) as base:
        yield base
