"""The pytest plugin of worker_cli.testing is found both ways a user loads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

FIXTURES = (
    "graphile_worker_database",
    "graphile_worker_db",
    "graphile_worker_sync_utils",
    "graphile_worker_utils",
)


@pytest.mark.parametrize("load", [(), ("-p", "worker_cli.testing")])
def test_the_fixtures_are_there_by_the_entry_point_and_by_p(
    load: tuple[str, ...], tmp_path: Path
) -> None:
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *load, "--fixtures"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for fixture in FIXTURES:
        assert f"{fixture} " in done.stdout or f"{fixture}\n" in done.stdout, fixture
