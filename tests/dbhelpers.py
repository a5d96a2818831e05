"""Small synchronous helpers for tests that inspect the database directly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row


def rows(url: str, query: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=dict_row)
        cur.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def value(url: str, query: str, params: Any = None) -> Any:
    result = rows(url, query, params)
    return next(iter(result[0].values())) if result else None


def cli_path() -> str:
    """The installed ``graphile-worker`` console script of this environment."""
    return str(Path(sys.executable).parent / "graphile-worker")


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    clean_env: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run the installed CLI as a user would; DATABASE_URL/PG* are not inherited."""
    base = dict(os.environ)
    if clean_env:
        for name in list(base):
            if name == "DATABASE_URL" or name.startswith("PG") or name == "GRAPHILE_WORKER_SCHEMA":
                del base[name]
    return subprocess.run(
        [cli_path(), *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
