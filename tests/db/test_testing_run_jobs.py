"""worker_cli.testing.run_jobs: the due jobs run in this process as the
worker runs them, on a connection string or in the caller's transaction."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value
from psycopg.pq import TransactionStatus

from worker_cli import Helpers, Workflow, make_sync_worker_utils, make_worker_utils, task_options
from worker_cli.errors import ConfigurationError, JobTimeout
from worker_cli.jobs.limit_spec import Limit
from worker_cli.tasks.retry_policy import RetryPolicy, Snooze
from worker_cli.testing import run_jobs, run_jobs_async

pytestmark = pytest.mark.db


def add(db: str, identifier: str, payload: Any = None, **options: Any) -> int:
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        return utils.add_job(identifier, payload, **options).id


def test_a_due_job_runs_once_and_its_success_is_recorded(db: str) -> None:
    calls: list[Any] = []

    def greet(payload: Any, helpers: Helpers) -> dict[str, str]:
        calls.append((payload, helpers.job.attempts))
        helpers.progress(3, 4, "nearly")
        return {"greeted": payload["name"]}

    job_id = add(db, "greet", {"name": "Ada"})
    ran = run_jobs(task_list={"greet": greet}, connection_string=db)
    assert [(r.id, r.state, r.result, r.error) for r in ran] == [
        (job_id, "succeeded", {"greeted": "Ada"}, None)
    ]
    assert calls == [({"name": "Ada"}, 1)]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        result = utils.get_job_result(job_id)
    assert (result.state, result.result) == ("succeeded", {"greeted": "Ada"})
    assert result.progress is not None and (result.progress.done, result.progress.total) == (3, 4)
    # Nothing is left due: a second call runs nothing.
    assert run_jobs(task_list={"greet": greet}, connection_string=db) == []


def test_a_failure_is_returned_recorded_and_retried_later(db: str) -> None:
    def broken(payload: Any, helpers: Helpers) -> None:
        helpers.logger.info("about to fail")
        raise ValueError("no such user")

    job_id = add(db, "broken")
    [ran] = run_jobs(task_list={"broken": broken}, connection_string=db)
    assert (ran.state, type(ran.error), ran.message) == (
        "retrying",
        ValueError,
        "ValueError: no such user",
    )
    [job] = rows(
        db, "select attempts, last_error, run_at > now() as later from graphile_worker.jobs"
    )
    assert job == {"attempts": 1, "last_error": "ValueError: no such user", "later": True}
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        [error] = utils.get_job_errors(job_id)
        [log] = utils.get_job_logs(job_id)
    assert error.error == "ValueError: no such user" and "raise ValueError" in (
        error.traceback or ""
    )
    assert any("about to fail" in line for line in log.lines)
    # Retried later, not now: nothing more runs.
    assert run_jobs(task_list={"broken": broken}, connection_string=db) == []


def test_raise_errors_raises_the_tasks_own_error_once_recorded(db: str) -> None:
    class Refused(Exception):
        pass

    async def refuse(payload: Any, helpers: Helpers) -> None:
        raise Refused("card declined")

    add(db, "refuse", max_attempts=1)
    with pytest.raises(Refused, match="card declined"):
        run_jobs(task_list={"refuse": refuse}, connection_string=db, raise_errors=True)
    assert rows(db, "select attempts, last_error from graphile_worker.jobs") == [
        {"attempts": 1, "last_error": "Refused: card declined"}
    ]


def test_retry_policies_snoozes_and_one_bad_job_alone(db: str) -> None:
    @task_options(retry=RetryPolicy(retry_on=(TimeoutError,)))
    def picky(payload: Any, helpers: Helpers) -> None:
        raise KeyError("not retried")

    def sleepy(payload: Any, helpers: Helpers) -> None:
        raise Snooze(3600)

    def exits(payload: Any, helpers: Helpers) -> None:
        raise SystemExit(3)  # a job's BaseException fails that job alone

    def fine(payload: Any, helpers: Helpers) -> str:
        return "ok"

    tasks = {"picky": picky, "sleepy": sleepy, "exits": exits, "fine": fine}
    ids = {name: add(db, name, priority=index) for index, name in enumerate(tasks)}
    ran = run_jobs(task_list=tasks, connection_string=db)
    assert {r.task_identifier: r.state for r in ran} == {
        "picky": "failed",  # its policy does not retry a KeyError
        "sleepy": "scheduled",  # snoozed: runs again in an hour, no attempt spent
        "exits": "retrying",
        "fine": "succeeded",
    }
    assert (
        value(db, "select attempts from graphile_worker.jobs where id = %s", (ids["sleepy"],)) == 0
    )


def test_timeouts_stop_async_tasks_and_tell_plain_ones(db: str) -> None:
    @task_options(timeout=0.05)
    async def hangs(payload: Any, helpers: Helpers) -> None:
        await asyncio.Event().wait()  # never set: only the timeout ends it

    @task_options(timeout=0.05)
    def loops(payload: Any, helpers: Helpers) -> None:
        while True:
            helpers.raise_if_cancelled()
            threading.Event().wait(0.005)

    add(db, "hangs")
    add(db, "loops")
    ran = run_jobs(task_list={"hangs": hangs, "loops": loops}, connection_string=db)
    assert [(r.task_identifier, type(r.error), r.message) for r in ran] == [
        ("hangs", JobTimeout, "JobTimeout: exceeded 0.05s"),
        ("loops", JobTimeout, "JobTimeout: exceeded 0.05s"),
    ]


def test_only_the_tasks_named_run(db: str) -> None:
    def one(payload: Any, helpers: Helpers) -> None:
        pass

    add(db, "one")
    other = add(db, "other")
    ran = run_jobs(task_list={"one": one, "other": one}, connection_string=db, tasks="one")
    assert [r.task_identifier for r in ran] == ["one"]
    assert value(db, "select array_agg(id) from graphile_worker._private_jobs") == [other]
    with pytest.raises(ConfigurationError, match=r"tasks names 'nope', not in the task list"):
        run_jobs(task_list={"one": one}, connection_string=db, tasks=["nope"])
    with pytest.raises(ConfigurationError, match="give task_list= or tasks_dir="):
        run_jobs(connection_string=db)


def test_jobs_the_tasks_add_run_too_and_a_limit_is_kept(db: str) -> None:
    async def fan_out(payload: Any, helpers: Helpers) -> None:
        for n in range(3):
            await helpers.add_job("leaf", {"n": n})

    def leaf(payload: Any, helpers: Helpers) -> int:
        running = helpers.run(
            helpers.query(
                "select cardinality(running) as running "
                "from graphile_worker._private_py_limit_state "
                "where kind = 'task' and name = 'leaf'"
            )
        )
        return int(running[0]["running"]) if running else -1

    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        utils.set_limit(Limit(max_running=1), task="leaf")
    add(db, "fan_out")
    ran = run_jobs(task_list={"fan_out": fan_out, "leaf": leaf}, connection_string=db)
    assert [(r.task_identifier, r.state) for r in ran] == [("fan_out", "succeeded")] + [
        ("leaf", "succeeded")
    ] * 3
    # Each leaf ran as the only one its limit let run, and released it.
    assert [r.result for r in ran[1:]] == [1, 1, 1]
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        [limit] = utils.list_limits()
    assert limit.running == 0


def test_a_job_that_is_always_due_stops_at_max_runs(db: str) -> None:
    def again(payload: Any, helpers: Helpers) -> None:
        raise Snooze(0)

    add(db, "again")
    with pytest.raises(RuntimeError, match="made 5 attempts and jobs are still due"):
        run_jobs(task_list={"again": again}, connection_string=db, max_runs=5)


def test_in_the_callers_transaction_and_rolled_back_with_it(db: str) -> None:
    def count(payload: Any, helpers: Helpers) -> int:
        found = helpers.run(helpers.query("select count(*) as n from public.orders"))
        return int(found[0]["n"])

    with psycopg.connect(db, autocommit=True) as setup:
        setup.execute("create table public.orders (id int)")
    threads = threading.active_count()
    with psycopg.connect(db) as conn:
        conn.execute("insert into public.orders values (1), (2)")
        # Added by SQL, as a trigger or a Node process would, in this transaction.
        conn.execute("select graphile_worker.add_job('count', '{}')")
        [ran] = run_jobs(task_list={"count": count}, connection=conn)
        assert (ran.state, ran.result) == ("succeeded", 2)  # saw the uncommitted rows
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # never committed
        assert conn.execute("select count(*) from graphile_worker.jobs").fetchone() == (0,)
        conn.rollback()
    assert threading.active_count() == threads  # no thread left behind
    # Rolled back: no job, no history, no task row even.
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert value(db, "select count(*) from graphile_worker._private_py_job_history") == 0
    assert value(db, "select count(*) from graphile_worker._private_tasks") == 0


def test_a_refused_write_leaves_the_callers_transaction_usable(db: str) -> None:
    def fine(payload: Any, helpers: Helpers) -> None:
        pass

    with psycopg.connect(db) as conn:
        # A user's trigger refuses the success's delete of one job: that job
        # is failed for good instead, as the worker does, and the other runs.
        conn.execute(
            """
            create function public.refuse() returns trigger language plpgsql as $$
            begin
              if old.payload::jsonb ? 'poison' then raise exception 'refused by a trigger'; end if;
              return old;
            end $$;
            create trigger refuse before delete on graphile_worker._private_jobs
              for each row execute function public.refuse();
            select graphile_worker.add_job('fine', '{"poison": true}');
            select graphile_worker.add_job('fine', '{}');
            """
        )
        ran = run_jobs(task_list={"fine": fine}, connection=conn)
        assert [r.state for r in ran] == ["failed", "succeeded"]
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        [(last_error,)] = conn.execute("select last_error from graphile_worker.jobs").fetchall()
        assert "refused by a trigger" in last_error
        conn.rollback()


def test_a_non_autocommit_connection_with_no_transaction_is_never_committed(db: str) -> None:
    def fine(payload: Any, helpers: Helpers) -> None:
        pass

    add(db, "fine")
    with psycopg.connect(db) as conn:
        assert conn.info.transaction_status == TransactionStatus.IDLE
        [ran] = run_jobs(task_list={"fine": fine}, connection=conn)
        assert ran.state == "succeeded"
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.rollback()
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 1


def test_a_connection_of_the_wrong_kind_is_one_line(db: str) -> None:
    with pytest.raises(ConfigurationError, match=r"expects an open psycopg\.Connection; got int"):
        run_jobs(task_list={"x": print}, connection=42)


async def test_the_async_form_in_an_async_transaction(db: str) -> None:
    async def async_task(payload: Any, helpers: Helpers) -> str:
        await helpers.add_job("plain_task", {"from": "async"})
        return "async"

    def plain_task(payload: Any, helpers: Helpers) -> str:
        found = helpers.run(helpers.query("select count(*) as n from graphile_worker.jobs"))
        return f"plain saw {found[0]['n']}"

    tasks = {"async_task": async_task, "plain_task": plain_task}
    threads = threading.active_count()
    async with await psycopg.AsyncConnection.connect(db) as conn:
        async with make_worker_utils(connection=conn) as utils:
            await utils.add_job("async_task")
        ran = await run_jobs_async(task_list=tasks, connection=conn)
        assert [(r.task_identifier, r.result) for r in ran] == [
            ("async_task", "async"),
            ("plain_task", "plain saw 1"),  # itself, locked, in this transaction
        ]
        await conn.rollback()
    assert threading.active_count() == threads
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def test_a_task_that_breaks_the_callers_transaction_fails_alone(db: str) -> None:
    def bad_sql(payload: Any, helpers: Helpers) -> None:
        helpers.run(helpers.query("insert into public.notes values ('lost with the attempt')"))
        helpers.run(helpers.query("select * from no_such_table"))

    def swallows(payload: Any, helpers: Helpers) -> None:
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            helpers.run(helpers.query("select 1/0"))
        # ... and goes on, in a transaction in error

    def fine(payload: Any, helpers: Helpers) -> None:
        helpers.run(helpers.query("insert into public.notes values ('kept')"))

    with psycopg.connect(db, autocommit=True) as setup:
        setup.execute("create table public.notes (note text)")
    tasks = {"bad_sql": bad_sql, "swallows": swallows, "fine": fine}
    with psycopg.connect(db) as conn:
        conn.execute("insert into public.notes values ('the test''s own')")
        for priority, name in enumerate(tasks):
            conn.execute("select graphile_worker.add_job(%s, priority => %s)", (name, priority))
        ran = run_jobs(task_list=tasks, connection=conn)
        assert [(r.task_identifier, r.state) for r in ran] == [
            ("bad_sql", "retrying"),
            ("swallows", "retrying"),
            ("fine", "succeeded"),
        ]
        assert isinstance(ran[0].error, psycopg.errors.UndefinedTable)
        assert "the attempt's database work was undone" in str(ran[1].error)
        notes = conn.execute("select note from public.notes order by note").fetchall()
        assert notes == [("kept",), ("the test's own",)]
        conn.rollback()


@pytest.mark.parametrize("form", ["sync", "async"])
def test_what_a_task_leaves_on_the_runners_session_is_undone(db: str, form: str) -> None:
    """On its own connection (a connection string), a task that changes the
    session (a 1 ms statement timeout, read-only transactions, another role,
    an advisory lock, a transaction left open) fails or succeeds alone: the
    writes of its outcome and the next jobs run on a clean session, as a
    worker's pool gives each job one."""

    async def spoils(payload: Any, helpers: Helpers) -> None:
        await helpers.query("select pg_advisory_lock(4405)")
        await helpers.query("set role pg_read_all_data")
        await helpers.query("set session characteristics as transaction read only")
        await helpers.query("set statement_timeout = 1")

    def leaves_open(payload: Any, helpers: Helpers) -> None:
        helpers.run(helpers.query("begin"))
        helpers.run(helpers.query("select 1"))

    async def after(payload: Any, helpers: Helpers) -> str:
        rows = await helpers.query(
            "select pg_sleep(0.01), concat_ws('|', current_setting('statement_timeout'), "
            "current_user, current_setting('default_transaction_read_only')) as session"
        )
        return str(rows[0]["session"])

    tasks = {"spoils": spoils, "leaves_open": leaves_open, "after": after}
    add(db, "spoils", priority=-2)
    add(db, "leaves_open", priority=-1)
    after_id = add(db, "after")
    if form == "sync":
        ran = run_jobs(task_list=tasks, connection_string=db)
    else:
        ran = asyncio.run(run_jobs_async(task_list=tasks, connection_string=db))
    assert [(r.job.task_identifier, r.state) for r in ran] == [
        ("spoils", "succeeded"),
        ("leaves_open", "succeeded"),
        ("after", "succeeded"),
    ], [(r.job.task_identifier, r.state, r.error) for r in ran]
    assert ran[-1].id == after_id and ran[-1].result == "0|postgres|off"
    # The advisory lock went with the reset: another session takes it at once.
    assert value(db, "select pg_try_advisory_lock(4405)") is True


def test_an_operation_limit_is_taken_and_given_back(db: str) -> None:
    """``helpers.limit`` works under run_jobs (it took a connection of the
    worker's pool, which the helpers have not): the block runs within the
    limit, and its slot is free again once the job ended."""
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        utils.set_limit(Limit(max_running=1), operation="stripe")
    inside: list[int] = []

    async def charge(payload: Any, helpers: Helpers) -> None:
        async with helpers.limit("stripe", partition=payload["customer"]):
            rows = await helpers.query(
                "select cardinality(running) as n from graphile_worker._private_py_limit_state "
                "where kind = 'operation' and name = 'stripe' and partition = %s",
                (payload["customer"],),
            )
            inside.append(rows[0]["n"])

    add(db, "charge", {"customer": "c1"})
    add(db, "charge", {"customer": "c2"})
    ran = run_jobs(task_list={"charge": charge}, connection_string=db)
    assert [(r.state, r.error) for r in ran] == [("succeeded", None)] * 2
    assert inside == [1, 1]
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        [info] = utils.list_limits()
    assert (info.name, info.running) == ("stripe", 0)


def test_a_workflow_runs_step_after_step(db: str) -> None:
    async def check(payload: Any, helpers: Helpers) -> dict[str, int]:
        return {"checked": payload["amount"]}

    def notify(payload: Any, helpers: Helpers) -> str:
        return f"parent said {helpers.parents['check'].result}"

    workflow = Workflow("order 1")
    first = workflow.add("check", {"amount": 10}, ref="check")
    workflow.add("notify", {}, after=[first], ref="notify")
    with make_sync_worker_utils(db, max_pool_size=1) as utils:
        added = utils.add_workflow(workflow)
        ran = run_jobs(task_list={"check": check, "notify": notify}, connection_string=db)
        info = utils.get_workflow(added.id)
    assert [(r.task_identifier, r.result) for r in ran] == [
        ("check", {"checked": 10}),
        ("notify", "parent said {'checked': 10}"),
    ]
    assert info is not None and info.state == "succeeded"


def test_a_job_python_cannot_read_fails_alone(db: str) -> None:
    def fine(payload: Any, helpers: Helpers) -> Any:
        return payload

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "select graphile_worker.add_job('fine', ('[' || repeat('9', 5000) || ']')::json, "
            "priority => -1)"
        )
        conn.execute("select graphile_worker.add_job('fine', '{\"n\": 1}')")
    ran = run_jobs(task_list={"fine": fine}, connection_string=db)
    # The unreadable one is failed for good without its task called (the
    # worker's rule), and reported; the other runs.
    assert [(r.state, type(r.error).__name__) for r in ran] == [
        ("failed", "UnreadableJobError"),
        ("succeeded", "NoneType"),
    ]
    assert ran[1].result == {"n": 1}
    [poison] = rows(db, "select attempts, max_attempts, last_error from graphile_worker.jobs")
    assert poison["attempts"] == poison["max_attempts"]
    assert "cannot be read as a Python value" in poison["last_error"]


def test_a_refused_progress_write_loses_that_report_alone(db: str) -> None:
    def reports(payload: Any, helpers: Helpers) -> str:
        helpers.progress(1, 2)
        return "done"

    with psycopg.connect(db) as conn:
        conn.execute(
            """
            create function public.refuse() returns trigger language plpgsql as $$
            begin raise exception 'no progress here'; end $$;
            create trigger refuse before insert on graphile_worker._private_py_job_progress
              for each row execute function public.refuse();
            select graphile_worker.add_job('reports', '{}');
            select graphile_worker.add_job('reports', '{}');
            """
        )
        ran = run_jobs(task_list={"reports": reports}, connection=conn)
        assert [(r.state, r.result) for r in ran] == [("succeeded", "done")] * 2
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        conn.rollback()
