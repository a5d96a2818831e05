"""``connection=``: the caller's psycopg connection, used exactly as it is.

The utilities join the caller's transaction and never commit, roll back or
close it, nor change its autocommit mode: a rolled-back transaction adds no
job, a committed one does, and until then no other session sees it (checked
from a second connection). Wrong objects get one clear error.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg2
import pytest
from dbhelpers import rows, value
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

from worker_cli import ConfigurationError, JobSpecError, make_sync_worker_utils, make_worker_utils

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
INTRANS = TransactionStatus.INTRANS


def jobs_seen_by_others(db: str) -> int:
    """Jobs as a second session sees them."""
    return int(value(db, f"select count(*) from {JOBS}"))


def schema_seen_by_others(db: str) -> bool:
    return bool(value(db, "select count(*) from pg_namespace where nspname = 'graphile_worker'"))


@pytest.mark.parametrize("cursor_factory", [psycopg.Cursor, psycopg.ClientCursor])
def test_sync_rollback_commit_and_visibility(db: str, cursor_factory: type[Any]) -> None:
    with psycopg.connect(db, cursor_factory=cursor_factory) as conn:
        # A fresh connection: no transaction open yet (as in Django's atomic()
        # before its first query); the job's statement opens the caller's.
        with make_sync_worker_utils(connection=conn) as utils:
            job = utils.add_job("t", {"n": 1})
            assert job.payload == {"n": 1}
        assert conn.info.transaction_status == INTRANS and not conn.autocommit
        assert jobs_seen_by_others(db) == 0
        conn.rollback()
        assert jobs_seen_by_others(db) == 0

        with make_sync_worker_utils(connection=conn) as utils:
            utils.add_jobs([{"identifier": "t"}, {"identifier": "u"}])
            assert jobs_seen_by_others(db) == 0  # not committed by add_jobs' transaction
            utils.add_job("t", {"n": 2})
        assert jobs_seen_by_others(db) == 0
        conn.commit()
        assert jobs_seen_by_others(db) == 3
    assert conn.closed  # closed by the caller's `with`, not before


async def test_async_rollback_commit_and_visibility(db: str) -> None:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        async with make_worker_utils(connection=conn) as utils:
            await utils.add_job("t", {"n": 1})
            await utils.add_jobs([{"identifier": "t"}, {"identifier": "u"}])
        assert conn.info.transaction_status == INTRANS and not conn.autocommit
        assert jobs_seen_by_others(db) == 0
        await conn.rollback()
        assert jobs_seen_by_others(db) == 0

        async with conn.transaction():
            async with make_worker_utils(connection=conn) as utils:
                await utils.add_job("t", {"n": 2})
            assert jobs_seen_by_others(db) == 0
        assert jobs_seen_by_others(db) == 1
        assert not conn.closed


def test_a_failed_call_undoes_only_its_own_work(db: str) -> None:
    """A batch refused half-way (its first chunk already sent) is rolled back to
    its savepoint: the caller's transaction goes on, with the caller's work."""
    rows(db, "create table orders (id serial primary key, item text)")
    batch = [{"identifier": "t", "payload": {"n": n}} for n in range(5001)]
    batch[5000] = {"identifier": ""}
    with psycopg.connect(db) as conn:
        conn.execute("insert into orders (item) values ('book')")
        with make_sync_worker_utils(connection=conn) as utils:
            with pytest.raises(JobSpecError, match=r"specs\[5000\]\.identifier"):
                utils.add_jobs(batch)
            assert conn.info.transaction_status == INTRANS  # not aborted
            assert conn.execute(f"select count(*) from {JOBS}").fetchone() == (0,)
            utils.add_job("t", {"after": "the failure"})
        conn.commit()
    assert value(db, "select count(*) from orders") == 1
    assert jobs_seen_by_others(db) == 1


async def test_async_a_failed_call_undoes_only_its_own_work(db: str) -> None:
    rows(db, "create table orders (id serial primary key, item text)")
    batch = [{"identifier": "t", "payload": {"n": n}} for n in range(5001)]
    batch[5000] = {"identifier": "t", "priority": 99999}
    async with await psycopg.AsyncConnection.connect(db) as conn:
        await conn.execute("insert into orders (item) values ('book')")
        async with make_worker_utils(connection=conn) as utils:
            with pytest.raises(JobSpecError, match=r"specs\[5000\]\.priority"):
                await utils.add_jobs(batch)
            assert conn.info.transaction_status == INTRANS
        await conn.commit()
    assert value(db, "select count(*) from orders") == 1
    assert jobs_seen_by_others(db) == 0


def test_in_autocommit_mode_each_call_commits(db: str) -> None:
    """The caller chose autocommit: add_jobs' transaction is a real one."""
    with psycopg.connect(db, autocommit=True) as conn:
        with make_sync_worker_utils(connection=conn) as utils:
            utils.add_job("t")
            assert jobs_seen_by_others(db) == 1
            utils.add_jobs([{"identifier": "t"}] * 2)
            assert jobs_seen_by_others(db) == 3
        assert conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def test_migrate_joins_the_callers_transaction(empty_db: str) -> None:
    with psycopg.connect(empty_db) as conn:
        with make_sync_worker_utils(connection=conn) as utils:
            report = utils.migrate()
            assert report.previous_revision is None and report.revision == 20
            assert utils.add_job("t").id == 1  # in the caller's transaction
        assert not conn.autocommit and conn.info.transaction_status == INTRANS
        assert not schema_seen_by_others(empty_db)
        conn.rollback()
        assert not schema_seen_by_others(empty_db)
        with make_sync_worker_utils(connection=conn) as utils:
            assert utils.migrate().previous_revision is None
            assert utils.migrate().applied == ()  # again, in the same transaction
        conn.commit()
    assert schema_seen_by_others(empty_db)


async def test_async_migrate_on_an_autocommit_connection(empty_db: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        async with make_worker_utils(connection=conn) as utils:
            report = await utils.migrate()
            assert report.applied[-1] == 20
            assert schema_seen_by_others(empty_db)  # each revision committed
        assert conn.autocommit
    async with await psycopg.AsyncConnection.connect(empty_db) as conn:
        async with make_worker_utils(connection=conn) as utils:
            assert (await utils.migrate()).applied == ()
        assert not conn.autocommit


def test_gc_unique_locks_in_the_callers_transaction(db: str) -> None:
    locks = "graphile_worker._private_py_unique_locks"
    with make_sync_worker_utils(connection_string=db) as utils:
        utils.add_jobs([{"identifier": "t", "payload": {"n": n}} for n in range(3)], unique={})
    rows(db, f"delete from {JOBS}")
    rows(db, f"update {locks} set expires_at = now()")
    with psycopg.connect(db) as conn:
        with make_sync_worker_utils(connection=conn) as utils:
            assert utils.gc_unique_locks() == 3
        assert not conn.autocommit
        assert value(db, f"select count(*) from {locks}") == 3
        conn.rollback()
    assert value(db, f"select count(*) from {locks}") == 3


def test_the_callers_row_factory_and_loaders_do_not_matter(db: str) -> None:
    """Django loads jsonb as text, and timestamps naive without USE_TZ."""

    class NaiveLoader(TextLoader):
        def load(self, data: Any) -> Any:
            return "not a datetime"

    with psycopg.connect(db, row_factory=dict_row) as conn:
        conn.adapters.register_loader("jsonb", TextLoader)
        conn.adapters.register_loader("timestamptz", NaiveLoader)
        with make_sync_worker_utils(connection=conn) as utils:
            job = utils.add_job("t", {"a": 1}, flags=["x"])
    assert job.flags == {"x": True}
    assert job.run_at.tzinfo is not None and job.payload == {"a": 1}


def test_wrong_connections_get_one_clear_error(db: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = []
    legacy = psycopg2.connect(db)
    try:
        cases.append(
            (
                {"connection": legacy},
                r"make_sync_worker_utils\(connection=\.\.\.\) expects an open "
                r"psycopg\.Connection \(psycopg 3\); got psycopg2\.extensions\.connection "
                r"\(psycopg2 is not supported",
            )
        )
        closed = psycopg.connect(db)
        closed.close()
        cases.append(
            ({"connection": closed}, r"expects an open psycopg\.Connection; this one is closed")
        )
        with psycopg.connect(db) as conn, ConnectionPool(db, open=False) as pool:
            cases.append(
                ({"connection": conn, "pool": pool}, "give connection= alone, not with pool=")
            )
            cases.append(
                ({"connection": conn, "connection_string": db}, "not with a connection string")
            )
            for kwargs, message in cases:
                with (
                    pytest.raises(ConfigurationError, match=message),
                    make_sync_worker_utils(**kwargs),
                ):
                    pytest.fail("no utilities for a wrong connection")
    finally:
        legacy.close()


async def test_wrong_connections_for_the_async_factory(db: str) -> None:
    with (
        psycopg.connect(db) as sync_conn,
        pytest.raises(
            ConfigurationError,
            match=r"make_worker_utils\(connection=\.\.\.\) expects an open "
            r"psycopg\.AsyncConnection \(psycopg 3\); got psycopg\.Connection "
            r"\(a sync connection: use make_sync_worker_utils\(connection=\.\.\.\)\)",
        ),
    ):
        async with make_worker_utils(connection=sync_conn):  # type: ignore[arg-type]
            pytest.fail("no utilities for a wrong connection")
    async with await psycopg.AsyncConnection.connect(db) as conn:
        with (
            pytest.raises(
                ConfigurationError, match=r"\(an async connection: use make_worker_utils"
            ),
            make_sync_worker_utils(connection=conn),  # type: ignore[arg-type]
        ):
            pytest.fail("no utilities for a wrong connection")
    legacy = psycopg2.connect(db)
    try:
        with pytest.raises(ConfigurationError, match="psycopg2 is not supported"):
            async with make_worker_utils(connection=legacy):
                pytest.fail("no utilities for a wrong connection")
    finally:
        legacy.close()
