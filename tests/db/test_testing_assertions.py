"""worker_cli.testing's assertions: what was added, read as the worker reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from worker_cli import make_sync_worker_utils, make_worker_utils
from worker_cli.testing import (
    added_jobs,
    added_jobs_async,
    assert_job_added,
    assert_job_added_async,
    assert_no_job_added,
    assert_no_job_added_async,
)

pytestmark = pytest.mark.db


@dataclass
class SendEmail:
    IDENTIFIER: ClassVar[str] = "send_email"
    to: str


def test_a_job_added_is_found_by_task_payload_and_fields(db: str) -> None:
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        added = utils.add_job(SendEmail("ada@example.com"), queue_name="mail", job_key="welcome")
        utils.add_job("report", {"day": 1}, priority=5)
    found = assert_job_added("send_email", {"to": "ada@example.com"}, connection_string=db)
    assert found.id == added.id
    # As add_job takes it: a payload whose class names its task; job_key for key.
    assert assert_job_added(SendEmail("ada@example.com"), connection_string=db).id == added.id
    assert_job_added("send_email", connection_string=db, queue_name="mail", job_key="welcome")
    assert_job_added("report", connection_string=db, priority=5)
    assert_no_job_added("send_email", {"to": "bob@example.com"}, connection_string=db)
    assert_no_job_added("cleanup", connection_string=db)
    assert [job.task_identifier for job in added_jobs(connection_string=db)] == [
        "send_email",
        "report",
    ]
    assert added_jobs("report", {"day": 2}, connection_string=db) == []


def test_a_failed_assertion_lists_what_was_added_instead(db: str) -> None:
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        utils.add_job("send_email", {"to": "ada@example.com"}, queue_name="mail")
        utils.add_job("report", {"day": 1})
    with pytest.raises(AssertionError) as missing:
        assert_job_added("send_email", {"to": "bob@example.com"}, connection_string=db)
    message = str(missing.value)
    assert message.startswith(
        "no job of task 'send_email' with payload {'to': 'bob@example.com'} was added; "
        "the queue holds 2 job(s):"
    )
    assert "send_email {'to': 'ada@example.com'} (run_at " in message
    assert "queue_name 'mail'" in message and "report {'day': 1}" in message
    with pytest.raises(AssertionError, match=r"^1 job\(s\) of task 'report' were added;"):
        assert_no_job_added("report", connection_string=db)
    with pytest.raises(TypeError, match="unknown field 'queue'"):
        assert_job_added("report", connection_string=db, queue="x")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("delete from graphile_worker._private_jobs")
    with pytest.raises(AssertionError, match=r"the queue holds no job$"):
        assert_job_added("report", connection_string=db)


def test_in_the_callers_open_transaction(db: str) -> None:
    with psycopg.connect(db) as conn:
        conn.execute("select graphile_worker.add_job('by_sql', '{\"n\": 1}')")  # a trigger's way
        assert_job_added("by_sql", {"n": 1}, connection=conn)
        assert_no_job_added("by_sql", connection_string=db)  # not committed: others see none
        # A read that fails (no such schema) leaves the transaction usable.
        with pytest.raises(psycopg.errors.UndefinedTable):
            added_jobs(connection=conn, schema="no_such_schema")
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        assert_job_added("by_sql", connection=conn)
        conn.rollback()


async def test_the_async_forms(db: str) -> None:
    async with await psycopg.AsyncConnection.connect(db) as conn:
        async with make_worker_utils(connection=conn) as utils:
            await utils.add_job("send_email", {"to": "ada@example.com"})
        job = await assert_job_added_async("send_email", connection=conn)
        assert job.payload == {"to": "ada@example.com"}
        await assert_no_job_added_async("send_email", connection_string=db)
        assert len(await added_jobs_async(connection=conn)) == 1
        with pytest.raises(AssertionError, match="the queue holds 1 job"):
            await assert_job_added_async("report", connection=conn)
        await conn.rollback()


def test_a_row_python_cannot_read_holds_up_no_other(db: str) -> None:
    # Written by SQL: a payload of 5,000 digits, and a run_at of -infinity.
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "select graphile_worker.add_job('poison', ('{\"n\": ' || repeat('9', 5000) || '}')"
            "::json, run_at => '-infinity')"
        )
        conn.execute("select graphile_worker.add_job('fine', '{\"n\": 1}')")
    assert assert_job_added("fine", {"n": 1}, connection_string=db).payload == {"n": 1}
    poison = assert_job_added("poison", connection_string=db)
    assert poison.payload == '{"n": ' + "9" * 5000 + "}"  # its text
    with pytest.raises(AssertionError, match=r"poison '\{\"n\": 9999"):
        assert_job_added("other", connection_string=db)
