"""A normal (non-editable) install ships the SQL files inside the package."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.db, pytest.mark.slow]


ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_migrations_and_installed_copy_migrates(tmp_path: Path, empty_db: str) -> None:
    wheel_dir = tmp_path / "wheel"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    [wheel] = wheel_dir.glob("graphile_worker-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = {
        f"worker_cli/migrations/{p.relative_to(ROOT / 'migrations')}"
        for p in (ROOT / "migrations").rglob("*.sql")
    }
    assert expected <= set(names)
    assert "worker_cli/py.typed" in names
    # The dashboard's templates, stylesheet, script and icon ship with it.
    dashboard = ROOT / "worker_cli" / "dashboard"
    assets = {
        f"worker_cli/dashboard/{p.relative_to(dashboard)}"
        for p in dashboard.rglob("*")
        if p.suffix in {".html", ".css", ".js", ".svg"}
    }
    assert len(assets) >= 10 and assets <= set(names), assets - set(names)
    # So do the Django admin's templates.
    app = ROOT / "worker_cli" / "contrib" / "django"
    templates = {
        f"worker_cli/contrib/django/{p.relative_to(app)}"
        for p in (app / "templates").rglob("*.html")
    }
    assert len(templates) >= 5 and templates <= set(names), templates - set(names)

    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    # Run from a folder with no source tree in sight, importing the installed copy.
    script = (
        "import asyncio, worker_cli, worker_cli.schema.migrate as m;"
        "print(worker_cli.__file__);"
        "print(m.MigrationFiles().directory);"
        f"print(asyncio.run(worker_cli.run_migrations({empty_db!r})).revision)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    module_file, migrations_dir, revision = result.stdout.split()
    assert module_file.startswith(str(target))
    assert migrations_dir == str(target / "worker_cli" / "migrations")
    assert revision == "20"
