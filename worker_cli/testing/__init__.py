"""Testing your tasks and the code that adds jobs, in your own test suite.

::

    from worker_cli.testing import assert_job_added, run_jobs

    def test_signup_sends_the_welcome_email(db_url):
        signup("ada@example.com")                      # your code: add_job(...)
        assert_job_added("send_email", {"to": "ada@example.com"})
        [ran] = run_jobs(task_list={"send_email": send_email})
        assert ran.state == "succeeded"

:func:`run_jobs` runs the jobs that are due, one at a time, in this process,
until none is left, with the worker's own code (its fetch, its ``Helpers``,
its outcome rules, its result statements): retries, results, history, retry
policies, timeouts and limits behave as under ``graphile-worker``, with no
background worker, no thread pool left behind and no sleeping. Given a
connection (a psycopg connection, or Django's ``django.db.connection``), it
runs them in that connection's open transaction: what the test added there
runs there, and the test's rollback undoes it all.

:func:`assert_job_added`, :func:`assert_no_job_added` and :func:`added_jobs`
read the jobs table as the worker does. Each has an async form for async
tests (``run_jobs_async``, ``assert_job_added_async``, ...) taking an
``AsyncConnection``. ``connection_string`` defaults to ``DATABASE_URL``, the
schema to ``GRAPHILE_WORKER_SCHEMA`` or ``graphile_worker``, as elsewhere.

The pytest plugin (loaded by installing the package, or with ``-p
worker_cli.testing``) brings fixtures: a migrated throwaway database and
utilities on it (:mod:`worker_cli.testing.pytest_plugin`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psycopg

from ..config.database import load_dotenv_file, resolve_connection_string, resolve_schema
from ..db.drivers import run_plan, run_plan_async
from ..errors import ConfigurationError
from ..jobs.job import Job
from ..tasks.loader import Task, TaskFunction, load_task_directory, make_task_list
from ..worker.pipeline.task_threads import contained_call
from .added import Match, added_jobs_plan, describe_jobs
from .inline_runner import Attempt, InlineRunner, RanJob
from .session import LoopThread, own_or_given, unwrap_connection

__all__ = [
    "MAX_RUNS",
    "RanJob",
    "added_jobs",
    "added_jobs_async",
    "assert_job_added",
    "assert_job_added_async",
    "assert_no_job_added",
    "assert_no_job_added_async",
    "run_jobs",
    "run_jobs_async",
]

#: ``-p worker_cli.testing`` loads the fixtures too.
pytest_plugins = ["worker_cli.testing.pytest_plugin"]

#: The most attempts one :func:`run_jobs` call makes before it gives up (a job
#: that snoozes for 0 seconds, or a task that adds its own job again, would
#: keep it running for ever).
MAX_RUNS = 10_000


def run_jobs(
    *,
    task_list: Mapping[str, TaskFunction] | None = None,
    tasks_dir: str | Path | None = None,
    connection_string: str | None = None,
    connection: Any = None,
    tasks: Iterable[str] | str | None = None,
    schema: str | None = None,
    raise_errors: bool = False,
    max_runs: int = MAX_RUNS,
) -> list[RanJob]:
    """Run the due jobs of ``tasks`` (default: every task of ``task_list`` or
    ``tasks_dir``) one at a time, in this thread, until none is due; returns
    each attempt made, in order, with what came of it. Jobs the tasks add,
    and retries due at once, run too. A failed attempt is recorded as the
    worker records it and returned with its error; with ``raise_errors``,
    its error is raised instead (once recorded).

    ``connection``: a psycopg ``Connection`` or Django's
    ``django.db.connection`` (then, without ``task_list``/``tasks_dir``, the
    tasks are the Django Tasks of the GraphileWorkerBackend on that database):
    the jobs run in its open transaction, never committed. Else a connection
    to ``connection_string`` (default ``DATABASE_URL``), each write committed
    as the worker commits it."""
    runner_setup = _setup(
        "run_jobs", task_list, tasks_dir, connection, tasks, schema, asynchronous=False
    )
    ran: list[RanJob] = []
    with LoopThread() as thread:
        stack = AsyncExitStack()
        try:
            runner = thread.run(runner_setup.open(stack, connection_string))
            try:
                while (job := thread.run(runner.next_job())) is not None or runner.unreadable:
                    ran += _unreadable(runner, raise_errors)
                    if job is None:
                        break
                    _check_runs(ran, max_runs)
                    attempt = thread.run(runner.prepare(job))
                    if attempt.task.is_async:
                        error = thread.run(runner.call_async(attempt))
                    else:  # here, as a worker's task thread calls it
                        error, attempt.returned = contained_call(
                            attempt.task.function, job, attempt.helpers, thread.loop
                        )
                    ran.append(thread.run(runner.finish(attempt, error)))
                    _raise_if_asked(ran[-1], raise_errors)
            finally:
                runner.close()
        finally:
            thread.run(stack.aclose())
    return ran


async def run_jobs_async(
    *,
    task_list: Mapping[str, TaskFunction] | None = None,
    tasks_dir: str | Path | None = None,
    connection_string: str | None = None,
    connection: psycopg.AsyncConnection[Any] | None = None,
    tasks: Iterable[str] | str | None = None,
    schema: str | None = None,
    raise_errors: bool = False,
    max_runs: int = MAX_RUNS,
) -> list[RanJob]:
    """:func:`run_jobs` for async code, on this event loop (``connection``:
    a psycopg ``AsyncConnection``). A plain ``def`` task is called in a
    thread made for it, joined before the next job starts."""
    runner_setup = _setup(
        "run_jobs_async", task_list, tasks_dir, connection, tasks, schema, asynchronous=True
    )
    ran: list[RanJob] = []
    async with AsyncExitStack() as stack:
        runner = await runner_setup.open(stack, connection_string)
        try:
            while (job := await runner.next_job()) is not None or runner.unreadable:
                ran += _unreadable(runner, raise_errors)
                if job is None:
                    break
                _check_runs(ran, max_runs)
                attempt = await runner.prepare(job)
                if attempt.task.is_async:
                    error = await runner.call_async(attempt)
                else:
                    error = await _in_thread(attempt)
                ran.append(await runner.finish(attempt, error))
                _raise_if_asked(ran[-1], raise_errors)
        finally:
            runner.close()
    return ran


class _Setup:
    """What a run needs, checked before anything is opened."""

    def __init__(
        self,
        tasks: dict[str, Task],
        selected: list[str],
        schema: str,
        given: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None,
    ) -> None:
        self.tasks, self.selected, self.schema, self.given = tasks, selected, schema, given

    async def open(self, stack: AsyncExitStack, connection_string: str | None) -> InlineRunner:
        conn, fetch_conn = await stack.enter_async_context(
            own_or_given(connection_string, self.given, 2)
        )
        runner = InlineRunner(
            conn,
            fetch_conn,
            schema=self.schema,
            tasks=self.tasks,
            selected=self.selected,
            own_session=self.given is None,
        )
        await runner.start()
        return runner


def _setup(
    function: str,
    task_list: Mapping[str, TaskFunction] | None,
    tasks_dir: str | Path | None,
    connection: Any,
    tasks: Iterable[str] | str | None,
    schema: str | None,
    *,
    asynchronous: bool,
) -> _Setup:
    given = None
    if connection is not None:
        django_alias = _django_alias(connection)
        given = unwrap_connection(connection, function=function, asynchronous=asynchronous)
        if django_alias is not None and task_list is None and tasks_dir is None:
            from ..contrib.django.testing import django_task_list

            task_list, django_schema = django_task_list(django_alias)
            schema = schema or django_schema
    if (task_list is None) == (tasks_dir is None):
        raise ConfigurationError(f"{function}: give task_list= or tasks_dir= (one of them)")
    if task_list is not None:
        if not task_list:
            raise ConfigurationError(f"{function}: task_list is empty")
        loaded = make_task_list(task_list)
    else:
        assert tasks_dir is not None
        loaded = load_task_directory(Path(tasks_dir))
    if tasks is None:
        selected = list(loaded)
    else:
        selected = [tasks] if isinstance(tasks, str) else list(tasks)
        unknown = [name for name in selected if name not in loaded]
        if unknown:
            raise ConfigurationError(
                f"{function}: tasks names {', '.join(map(repr, unknown))}, not in the task "
                f"list ({', '.join(map(repr, sorted(loaded)))})"
            )
    return _Setup(loaded, selected, resolve_schema(schema), given)


def _django_alias(connection: Any) -> str | None:
    """The alias of Django's connection wrapper (None: not one)."""
    if type(connection).__module__.startswith("django"):
        alias = getattr(connection, "alias", None)
        return alias if isinstance(alias, str) else None
    return None


def _check_runs(ran: list[RanJob], max_runs: int) -> None:
    if len(ran) >= max_runs:
        raise RuntimeError(
            f"run_jobs made {len(ran)} attempts and jobs are still due (a job that snoozes "
            "for 0 seconds, or a task adding its own job again?); pass max_runs= to allow more"
        )


def _unreadable(runner: InlineRunner, raise_errors: bool) -> list[RanJob]:
    """The jobs the last fetch failed for rows that cannot be read."""
    failed, runner.unreadable = runner.unreadable, []
    for one in failed:
        _raise_if_asked(one, raise_errors)
    return failed


def _raise_if_asked(ran: RanJob, raise_errors: bool) -> None:
    if raise_errors and ran.error is not None:
        raise ran.error


async def _in_thread(attempt: Attempt) -> BaseException | None:
    """Call a plain task in a thread of its own, as a worker's task thread
    would (``helpers.run`` reaches this loop); wait for it to end."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def call() -> None:
        try:
            error, attempt.returned = contained_call(
                attempt.task.function, attempt.job, attempt.helpers, loop
            )
            outcome[0] = error
        finally:
            loop.call_soon_threadsafe(done.set_result, None)

    outcome: list[BaseException | None] = [None]
    thread = threading.Thread(target=call, name=f"graphile-worker-testing-job-{attempt.job.id}")
    thread.start()
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        # Told, as a cancelled job is; never left running behind the caller.
        attempt.helpers.mark_cancelled("run_jobs_async was cancelled")
        await done
        thread.join()
        raise
    thread.join()
    return outcome[0]


def added_jobs(
    task_identifier: Any = None,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: Any = None,
    schema: str | None = None,
    **fields: Any,
) -> list[Job]:
    """The jobs in the queue, oldest first: of ``task_identifier`` (a payload
    whose class names its task will do, as in ``add_job``), with this
    ``payload`` (compared as JSON data) and these ``fields`` (``queue_name``,
    ``priority``, ``run_at``, ``max_attempts``, ``job_key``, ``flags``, ...,
    compared with ``==``); all of them when nothing is given. Read on
    ``connection`` (in its open transaction) or ``connection_string``."""
    match = Match("added_jobs", task_identifier, payload, fields)
    return [job for job in _read_sync("added_jobs", match, connection_string, connection, schema)]


async def added_jobs_async(
    task_identifier: Any = None,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: psycopg.AsyncConnection[Any] | None = None,
    schema: str | None = None,
    **fields: Any,
) -> list[Job]:
    """:func:`added_jobs` for async code."""
    match = Match("added_jobs_async", task_identifier, payload, fields)
    return await _read_async("added_jobs_async", match, connection_string, connection, schema)


def assert_job_added(
    task_identifier: Any,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: Any = None,
    schema: str | None = None,
    **fields: Any,
) -> Job:
    """Assert that a job of ``task_identifier`` (with this ``payload`` and
    these ``fields``, when given: see :func:`added_jobs`) is in the queue;
    returns it (the oldest, if several). The AssertionError lists what the
    queue holds instead."""
    match = Match("assert_job_added", task_identifier, payload, fields)
    jobs = _read_sync("assert_job_added", match, connection_string, connection, schema, all=True)
    return _found(match, jobs)


async def assert_job_added_async(
    task_identifier: Any,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: psycopg.AsyncConnection[Any] | None = None,
    schema: str | None = None,
    **fields: Any,
) -> Job:
    """:func:`assert_job_added` for async code."""
    match = Match("assert_job_added_async", task_identifier, payload, fields)
    jobs = await _read_async(
        "assert_job_added_async", match, connection_string, connection, schema, all=True
    )
    return _found(match, jobs)


def assert_no_job_added(
    task_identifier: Any,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: Any = None,
    schema: str | None = None,
    **fields: Any,
) -> None:
    """Assert that no job of ``task_identifier`` (with this ``payload`` and
    these ``fields``, when given) is in the queue; the AssertionError lists
    those that are."""
    match = Match("assert_no_job_added", task_identifier, payload, fields)
    _none_found(
        match, _read_sync("assert_no_job_added", match, connection_string, connection, schema)
    )


async def assert_no_job_added_async(
    task_identifier: Any,
    payload: Any = None,
    *,
    connection_string: str | None = None,
    connection: psycopg.AsyncConnection[Any] | None = None,
    schema: str | None = None,
    **fields: Any,
) -> None:
    """:func:`assert_no_job_added` for async code."""
    match = Match("assert_no_job_added_async", task_identifier, payload, fields)
    _none_found(
        match,
        await _read_async(
            "assert_no_job_added_async", match, connection_string, connection, schema
        ),
    )


def _found(match: Match, jobs: list[Job]) -> Job:
    for job in jobs:
        if match.matches(job):
            return job
    raise AssertionError(f"no job {match.describe()} was added; {describe_jobs(jobs)}")


def _none_found(match: Match, matching: list[Job]) -> None:
    if matching:
        raise AssertionError(
            f"{len(matching)} job(s) {match.describe()} were added; {describe_jobs(matching)}"
        )


def _read_sync(
    function: str,
    match: Match,
    connection_string: str | None,
    connection: Any,
    schema: str | None,
    *,
    all: bool = False,
) -> list[Job]:
    """The jobs ``match`` is about (``all``: the whole queue, for the message)."""
    plan = added_jobs_plan(resolve_schema(schema), None if all else match.task)
    if connection is not None:
        conn = unwrap_connection(connection, function=function, asynchronous=False)
        jobs = run_plan(conn, plan, joined=True)
    else:
        load_dotenv_file()
        with psycopg.connect(resolve_connection_string(connection_string), autocommit=True) as own:
            jobs = run_plan(own, plan)
    return jobs if all else [job for job in jobs if match.matches(job)]


async def _read_async(
    function: str,
    match: Match,
    connection_string: str | None,
    connection: psycopg.AsyncConnection[Any] | None,
    schema: str | None,
    *,
    all: bool = False,
) -> list[Job]:
    plan = added_jobs_plan(resolve_schema(schema), None if all else match.task)
    if connection is not None:
        conn = unwrap_connection(connection, function=function, asynchronous=True)
        jobs = await run_plan_async(conn, plan, joined=True)
    else:
        load_dotenv_file()
        conninfo = resolve_connection_string(connection_string)
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as own:
            jobs = await run_plan_async(own, plan)
    return jobs if all else [job for job in jobs if match.matches(job)]
