"""Timeouts: declared per task (``@task_options``) or per job (``add_job(...,
timeout=...)``)."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from dbhelpers import rows, value

from worker_cli import (
    Helpers,
    JobSpecError,
    TaskOptions,
    WorkerUtils,
    make_sync_worker_utils,
    quick_add_job,
    task_options,
    typed_task_list,
)
from worker_cli.tasks.loader import load_task_directory, make_task_list

OPTIONS = "graphile_worker._private_py_job_options"
JOBS = "graphile_worker._private_jobs"


# --- Declaring timeouts --------------------------------------------------------


@dataclass
class Resize:
    IDENTIFIER: ClassVar[str] = "resize"
    width: int


@pytest.mark.unit
def test_task_options_are_declared_beside_the_task_and_loaded_with_it(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(
        "from datetime import timedelta\n"
        "from worker_cli import task_options\n\n"
        "@task_options(timeout=timedelta(minutes=2), on_timeout='fail', on_stuck='exit')\n"
        "def task(payload, helpers):\n    pass\n"
    )
    (tmp_path / "plain.py").write_text("async def task(payload, helpers):\n    pass\n")
    (tmp_path / "script").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "script").chmod(stat.S_IRWXU)
    loaded = load_task_directory(tmp_path)
    assert loaded["slow"].options == TaskOptions(timeout=120, on_timeout="fail", on_stuck="exit")
    assert loaded["plain"].options == TaskOptions()
    assert loaded["plain"].options.timeout is None  # none by default, as in Node
    assert loaded["script"].options == TaskOptions()

    @task_options(timeout=1.5, on_timeout="cancel")
    async def listed(payload: Any, helpers: Helpers) -> None: ...

    @task_options(timeout=3)
    async def typed(payload: Resize, helpers: Helpers) -> None: ...

    tasks = make_task_list({"listed": listed, **typed_task_list(typed)})
    assert tasks["listed"].options == TaskOptions(timeout=1.5, on_timeout="cancel")
    assert tasks["resize"].options.timeout == 3  # a typed task keeps its options
    assert tasks["resize"].function is not typed  # (it is wrapped)
    with pytest.raises(AttributeError):
        tasks["listed"].options.timeout = 5  # type: ignore[misc]
    for bad in ({"timeout": 0}, {"timeout": "3"}, {"on_timeout": "skip"}, {"on_stuck": "kill"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            task_options(**bad)  # type: ignore[arg-type]


@pytest.mark.db
async def test_a_jobs_own_timeout_is_stored_beside_it_only_when_given(
    utils: WorkerUtils, db: str
) -> None:
    plain = await utils.add_job("t", {})
    timed = await utils.add_job("t", {}, timeout=30)
    keyed = await utils.add_job("t", {}, job_key="k", timeout=timedelta(minutes=2))
    assert (await utils.add_job("t", {}, job_key="k")).id == keyed.id  # keeps its timeout
    batch = await utils.add_jobs(
        [
            {"identifier": "t", "timeout": 1.5},
            {"identifier": "t"},
            {"identifier": "t", "timeout": 7},
        ]
    )
    unique = await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": 1}, "timeout": 4}, {"identifier": "t"}],
        unique={"period": 60},
    )
    conflict = await utils.add_job("t", {"n": 1}, timeout=99, unique={"period": 60})
    quick = await quick_add_job("t", {}, connection_string=db, timeout=12)
    with make_sync_worker_utils(connection_string=db) as sync:
        synced = sync.add_job("t", {}, timeout=5)
    stored = {row["job_id"]: row["timeout"] for row in rows(db, f"select * from {OPTIONS}")}
    assert stored == {
        timed.id: timedelta(seconds=30),
        keyed.id: timedelta(minutes=2),
        batch[0].id: timedelta(seconds=1.5),
        batch[2].id: timedelta(seconds=7),
        unique[0].job_id: timedelta(seconds=4),
        quick.id: timedelta(seconds=12),
        synced.id: timedelta(seconds=5),
    }
    assert plain.id not in stored and batch[1].id not in stored and conflict.conflict
    refused = [(0, "more than 0"), (-1, "more than 0"), (float("nan"), "more than 0"),
               (True, "not bool"), ("30", "not str"), (10**9, "at most a year")]  # fmt: skip
    for bad, reason in refused:
        with pytest.raises(JobSpecError, match=reason) as info:
            await utils.add_job("t", {}, timeout=bad)
        assert info.value.field == "timeout"
    with pytest.raises(JobSpecError) as info:
        await utils.add_jobs([{"identifier": "t"}, {"identifier": "t", "timeout": -3}])
    assert info.value.field == "specs[1].timeout"
    assert value(db, f"select count(*) from {JOBS}") == 10  # nothing half added


# --- The fetch ---------------------------------------------------------------


@pytest.mark.db
def test_the_fetch_is_py_get_jobs_with_the_jobs_timeout_added(db: str) -> None:
    """py_fetch_jobs cannot drift from py_get_jobs (which stays, unchanged, for
    workers of older versions): the same body with now() read once (or the
    worker's now_at) and the timeout column added."""
    functions = {
        (row["name"], row["arity"]): row
        for row in rows(
            db,
            "select p.proname as name, p.pronargs as arity, p.prosrc as source, "
            "p.proconfig as settings from pg_proc as p "
            "join pg_namespace as n on n.oid = p.pronamespace "
            "where n.nspname = 'graphile_worker' and p.proname in ('py_get_jobs', 'py_fetch_jobs')",
        )
    }
    assert sorted(functions) == [("py_fetch_jobs", 5), ("py_get_jobs", 4), ("py_get_jobs", 5)]
    old, new = functions["py_get_jobs", 4], functions["py_fetch_jobs", 5]
    expected = (
        old["source"]
        .replace("now()", "v_now")
        .replace(
            "\nbegin\n", "\ndeclare\n  v_now timestamptz := coalesce(now_at, now());\nbegin\n", 1
        )
        .replace(
            "\n    end;\nend;\n",
            "\n    end,\n"
            "    -- The job's own timeout, if it has one: a primary-key lookup per job,\n"
            "    -- made only while any job has options (one look per fetch: an initplan).\n"
            "    case when (select exists (select from"
            ' "graphile_worker"._private_py_job_options)) then\n'
            '      (select o.timeout from "graphile_worker"._private_py_job_options as o'
            " where o.job_id = j.id)\n"
            "    end;\nend;\n",
        )
    )
    assert new["source"] == expected
    assert new["settings"] == old["settings"]


@pytest.mark.db
async def test_the_fetch_returns_each_jobs_timeout_and_looks_once_when_none_has_one(
    utils: WorkerUtils, db: str
) -> None:
    """A drain of jobs without options costs the fetch one look at the
    options per fetch, not one per job (a functional check of its plan)."""
    import psycopg

    await utils.add_jobs([{"identifier": "t"} for _ in range(40)])
    with psycopg.connect(db) as conn:
        task_id = conn.execute("select id from graphile_worker._private_tasks").fetchone()
        fetch = "select id, timeout from graphile_worker.py_fetch_jobs(%s::int[], null, 20, 'p')"
        scans = (
            "select pg_stat_get_xact_numscans("
            "'graphile_worker._private_py_job_options_pkey'::regclass)"
        )
        fetched = conn.execute(fetch, ([task_id[0]],)).fetchall()
        assert len(fetched) == 20 and {t for _, t in fetched} == {None}
        assert conn.execute(scans).fetchone() == (1,)  # one look, for 20 jobs
        conn.commit()
        timed = await utils.add_job("t", {}, timeout=9, priority=-1)
        timeouts = dict(conn.execute(fetch, ([task_id[0]],)).fetchall())
        assert len(timeouts) == 20 and timeouts.pop(timed.id) == timedelta(seconds=9)
        assert set(timeouts.values()) == {None}
