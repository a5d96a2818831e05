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


def admin_cli(
    *args: str, env: dict[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A command that is not the worker (``jobs``, ``status``, ``pause``...)
    as :func:`run_cli` runs it, but in this process (click's runner: no
    interpreter to start). An error the command did not turn into its one
    line is raised here."""
    from click.testing import CliRunner

    from worker_cli.cli import command

    unset: dict[str, str | None] = {
        name: None
        for name in os.environ
        if name == "DATABASE_URL" or name.startswith("PG") or name == "GRAPHILE_WORKER_SCHEMA"
    }
    result = CliRunner().invoke(
        command,
        list(args),
        input=input,
        env={**unset, "GRAPHILE_WORKER_CONFIG": None, **(env or {})},
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


#: History rows that no row of the expiry ledger lists (migrations/py/000011.sql):
#: rows the pruning would never find. Every statement that records a job in
#: the history lists it there; the ``db`` fixture checks this after each test.
UNLISTED_HISTORY = """
  select coalesce(array_agg(u.job_id order by u.job_id), '{}')
  from (
    select h.job_id from graphile_worker._private_py_job_history as h
    except
    select unnest(e.job_ids) from graphile_worker._private_py_job_history_expiry as e
  ) as u
"""


def list_history_for_expiry(url: str) -> None:
    """List the history rows a test wrote itself in the expiry ledger, as the
    worker's statements do (1,000 ids a ledger row, by expiry time)."""
    rows(
        url,
        """
        insert into graphile_worker._private_py_job_history_expiry (expires_at, job_ids)
        select h.expires_at, array_agg(h.job_id order by h.job_id)
        from (
          select x.job_id, x.expires_at,
            (row_number() over (partition by x.expires_at order by x.job_id) - 1) / 1000 as chunk
          from graphile_worker._private_py_job_history as x
          where x.job_id in (
            select h.job_id from graphile_worker._private_py_job_history as h
            except
            select unnest(e.job_ids) from graphile_worker._private_py_job_history_expiry as e
          )
        ) as h
        group by h.expires_at, h.chunk
        """,
    )


def stuck_in_heartbeat(db: str, pool_id: str) -> list[int] | None:
    """The stuck jobs a pool's last beat listed (migrations/py/000012.sql)."""
    found = value(
        db,
        "select stuck_job_ids from graphile_worker._private_py_heartbeats where pool_id = %s",
        (pool_id,),
    )
    return None if found is None else list(found)
