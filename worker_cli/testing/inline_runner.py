"""The worker's pipeline for one job at a time, on one connection, for tests.

:class:`InlineRunner` fetches a due job (the worker's fetch statement, and
its second one for jobs under limits), calls its task with the worker's
``Helpers``, settles what came of it with the worker's
:class:`~worker_cli.worker.pipeline.outcome.Settler` (results, batch
results, Snooze/Cancel/Discard, retry policies, timeouts) and writes it with
the worker's :class:`~worker_cli.worker.pipeline.result_writer.ResultWriter`
(history, attempt errors, job logs, limits' and named queues' bookkeeping,
workflows). Nothing runs in the background: no listener, heartbeat, pool
or thread of its own; the caller drives it step by step
(:mod:`worker_cli.testing` does, in its sync and async forms), and a plain
``def`` task is called where the caller says.

Everything goes through one connection: each write in a savepoint of its own
(or its own transaction on an autocommit connection), so a refused write
never aborts the caller's transaction.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..client.worker_utils import WorkerUtils
from ..config.options import WorkerOptions
from ..db.backoff import one_line
from ..db.held_connection import reset_session
from ..db.raw_json import read_payloads_raw
from ..errors import JobTimeout
from ..jobs.job import Job
from ..jobs.job_state import JobState
from ..jobs.workflow import is_step
from ..jobs.workflow_state import StepContext, step_contexts
from ..observe import log_output as logs
from ..sql import compose
from ..sql import fetch as fetch_sql
from ..sql import job_progress as progress_sql
from ..sql import sessions as sessions_sql
from ..sql import workflows as workflows_sql
from ..tasks.helpers import MESSAGE_MAX, Helpers
from ..tasks.loader import Task
from ..worker.pipeline.fetcher import register_tasks
from ..worker.pipeline.limited_fetch import LimitedFetch
from ..worker.pipeline.outcome import Failure, Ran, Settler
from ..worker.pipeline.result_writer import HistorySettings, ResultWriter, refused
from ..worker.pipeline.task_threads import timed_out_error
from ..worker.pipeline.unreadable import read_jobs
from ..worker.supervision.deadlines import job_timeout, task_timeouts

__all__ = ["Attempt", "InlineRunner", "RanJob"]

logger = logging.getLogger("graphile_worker")


@dataclass(frozen=True)
class RanJob:
    """One attempt :func:`~worker_cli.testing.run_jobs` ran, and what came of it."""

    #: The job as its task saw it (``attempts`` counts this attempt).
    job: Job
    #: The job's state once the attempt was written: ``succeeded``,
    #: ``retrying``, ``failed``, ``cancelled``, ``scheduled`` (snoozed), ...
    #: (the words of :data:`~worker_cli.jobs.job_state.JobState`).
    state: JobState
    #: What the task raised (None: it returned).
    error: BaseException | None = None
    #: The text stored as the job's ``last_error`` (None: it succeeded).
    message: str | None = None
    #: What the task returned (None on a failure).
    result: Any = field(default=None, repr=False)

    @property
    def id(self) -> int:
        """The job's id."""
        return self.job.id

    @property
    def task_identifier(self) -> str:
        """The job's task."""
        return self.job.task_identifier

    @property
    def payload(self) -> Any:
        """The job's payload, as its task received it."""
        return self.job.payload

    @property
    def succeeded(self) -> bool:
        """The attempt succeeded."""
        return self.error is None


@dataclass
class Attempt:
    """A job about to run, or running: what its task receives, and its timeout."""

    job: Job
    task: Task
    helpers: Helpers
    timeout: float | None
    started: float = 0.0
    #: The timeout passed while it ran (a plain task is told through its helpers).
    timed_out: float | None = None
    timer: asyncio.TimerHandle | None = None
    returned: Any = None


class _OneConnection:
    """The runner's connection as the result writer takes connections: each
    write in a savepoint (or a transaction of its own on an autocommit
    connection), so that one refused write undoes itself alone."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = self._conn
        await join_transaction(conn)
        async with conn.transaction():
            yield conn


async def join_transaction(conn: psycopg.AsyncConnection[Any]) -> None:
    """On a connection that is not in autocommit and has no transaction open,
    open it (psycopg would otherwise commit the one ``transaction()`` opens):
    the caller's connection is never committed."""
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        await conn.execute(sessions_sql.OPEN_TRANSACTION)


class InlineRunner:
    """Runs the due jobs of ``tasks`` one at a time on ``conn`` (see the module)."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        fetch_conn: psycopg.AsyncConnection[Any],
        *,
        schema: str,
        tasks: Mapping[str, Task],
        selected: Sequence[str],
        options: WorkerOptions | None = None,
        own_session: bool = False,
    ) -> None:
        options = options or WorkerOptions()
        self._conn = conn
        #: The session is the runner's (not a caller's): what a task leaves
        #: on it is undone after each attempt, as a worker's pool does.
        self._own_session = own_session
        #: The same session, its ``json`` loaded unparsed (the fetch's rows).
        self._fetch_conn = fetch_conn
        read_payloads_raw(fetch_conn)
        self._schema = schema
        self._tasks = tasks
        self._selected = list(selected)
        self.pool_id = f"testing-{secrets.token_hex(8)}"
        self._utils = WorkerUtils(None, schema, connection=conn)
        self._writer = ResultWriter(
            _OneConnection(conn),
            schema=schema,
            pool_id=self.pool_id,
            history=HistorySettings(options.keep_succeeded) if options.history else None,
            success_logs=options.job_logs == "all",
        )
        self._settler = Settler(
            tasks,
            result_limit=options.max_result_bytes if options.history else None,
            step_result_limit=options.max_result_bytes,
            cancelling={},
        )
        self._capture_logs = options.job_logs != "off"
        self._get_jobs = compose(fetch_sql.GET_JOBS, schema)
        self._step_contexts = compose(workflows_sql.STEP_CONTEXTS, schema)
        self._write_progress = compose(progress_sql.WRITE_PROGRESS, schema)
        self._limited = LimitedFetch(schema, use_local_time=False, nudge=lambda: None)
        self._task_timeouts = task_timeouts(tasks)
        self._timeouts: dict[int, float] = {}
        self._steps: dict[int, StepContext] = {}
        self._task_ids: dict[int, str] = {}
        #: Each running job's latest ``helpers.progress`` report (any thread).
        self._progress: dict[int, tuple[float, float | None, str | None]] = {}
        #: Jobs whose rows could not be read, failed at the fetch (their task
        #: never called): the drivers report them with what ran.
        self.unreadable: list[RanJob] = []
        #: The running attempt has a savepoint (the session was in a transaction).
        self._savepoint = False

    async def start(self) -> None:
        """Register the tasks (their ids), as a worker does at its start."""
        await join_transaction(self._conn)
        self._task_ids = await register_tasks(self._conn, self._schema, self._selected)

    def close(self) -> None:
        """Plan nothing more (a limit's planned nudge)."""
        self._limited.stop()

    async def next_job(self) -> Job | None:
        """Lock the next due job (None: none is left). A job whose row cannot
        be read is failed here, alone (its task never called), and the next
        one taken."""
        while True:
            jobs, fetched = await self._fetch()
            if jobs:
                return jobs[0]
            if not fetched:
                return None

    async def _fetch(self) -> tuple[list[Job], int]:
        """The worker's fetch for one job, then its limited fetch if none came:
        the jobs to run, and how many rows came (unreadable ones included)."""
        conn = self._fetch_conn
        params: dict[str, Any] = {
            "task_ids": list(self._task_ids),
            "forbidden_flags": None,
            "limit": 1,
            "pool_id": self.pool_id,
        }
        taken: list[Job] = []

        async def take(
            conn: psycopg.AsyncConnection[Any], cur: psycopg.AsyncCursor[Any], first: Any = None
        ) -> int:
            jobs, unreadable = await read_jobs(cur, self._task_ids, self._timeouts)
            steps = [job.id for job in jobs if job.flags is not None and is_step(job.flags)]
            if steps:
                cur = await conn.execute(self._step_contexts, {"job_ids": steps})
                self._steps.update(step_contexts(await cur.fetchall()))
            for job, error in unreadable:  # never run: failed alone, in the pool's name
                outcome = await self._write(Ran(job, self.pool_id, error, 0.0))
                state = await self._utils.get_job_status(job.id)
                message = outcome.message if isinstance(outcome, Failure) else None
                self.unreadable.append(RanJob(job, state, error, message))
            taken.extend(jobs)
            return len(jobs) + len(unreadable)

        cur = await conn.cursor(binary=True).execute(self._get_jobs, params)
        fetched = await take(conn, cur)
        if not fetched and await self._limited.applies(conn, short=True):
            fetched = await self._limited.fetch(conn, params, 1, take)
        return taken, fetched

    async def prepare(self, job: Job) -> Attempt:
        """What ``job``'s task receives, its timeout armed (on this loop); in
        a transaction, a savepoint before it (see :meth:`_end_savepoint`)."""
        conn = self._conn
        self._savepoint = conn.info.transaction_status == TransactionStatus.INTRANS
        if self._savepoint:
            await conn.execute(sessions_sql.ATTEMPT_SAVEPOINT)
        task = self._tasks[job.task_identifier]
        loop = asyncio.get_running_loop()
        helpers = Helpers(
            job,
            worker_id=self.pool_id,
            utils=self._utils,
            abort_signal=asyncio.Event(),
            loop=loop,
            step=self._steps.pop(job.id, None),
            progress=self._report_progress,
            capture_logs=self._capture_logs,
        )
        attempt = Attempt(job, task, helpers, job_timeout(job, self._timeouts, self._task_timeouts))
        attempt.started = time.perf_counter()
        if attempt.timeout is not None and not task.is_async:
            attempt.timer = loop.call_later(attempt.timeout, self._time_out, attempt)
        return attempt

    @staticmethod
    def _time_out(attempt: Attempt) -> None:
        """A plain task's timeout passed: told through its helpers, as the worker does."""
        assert attempt.timeout is not None
        attempt.timed_out = attempt.timeout
        attempt.helpers.mark_timed_out(attempt.timeout)

    def _report_progress(
        self, job_id: int, done: float, total: float | None, message: str | None
    ) -> None:
        self._progress[job_id] = (done, total, message)

    async def call_async(self, attempt: Attempt) -> BaseException | None:
        """Call an ``async def`` task (cancelled at its timeout, as the worker
        does); what it raised (None: it returned, ``attempt.returned``)."""
        job, helpers = attempt.job, attempt.helpers
        call = asyncio.ensure_future(_called(attempt.task, job, helpers))
        loop = asyncio.get_running_loop()
        if attempt.timeout is not None:
            attempt.timer = loop.call_later(attempt.timeout, self._cancel_at_timeout, attempt, call)
        try:
            attempt.returned, raised = await asyncio.shield(call)
            if raised is not None:
                return raised
        except asyncio.CancelledError:
            if not call.done():  # the caller itself is cancelled: the task too
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
                raise
            if attempt.timed_out is not None:
                return JobTimeout(attempt.timed_out)
            return asyncio.CancelledError()  # the task awaited something someone cancelled
        except BaseException as exc:  # SystemExit, GeneratorExit, ... too: the job failed
            return exc
        return None

    def _cancel_at_timeout(self, attempt: Attempt, call: asyncio.Future[Any]) -> None:
        self._time_out(attempt)
        call.cancel()

    async def finish(self, attempt: Attempt, error: BaseException | None) -> RanJob:
        """Settle and write the attempt (its last progress report first);
        what came of it."""
        if attempt.timer is not None:
            attempt.timer.cancel()
        if self._savepoint and await self._end_savepoint() and error is None:
            error = RuntimeError(
                "the task's own statement failed in the caller's transaction (and the task "
                "went on): the attempt's database work was undone"
            )
        if self._own_session:
            await self._reset_session()
        job = attempt.job
        duration = (time.perf_counter() - attempt.started) * 1000
        ran = Ran(
            job, self.pool_id, error, duration, None if error is not None else attempt.returned
        )
        ran.log = attempt.helpers.attempt_log
        if attempt.timed_out is not None:
            ran.timed_out = attempt.task.options.on_timeout
            if error is not None and not isinstance(error, JobTimeout):
                ran.error = timed_out_error(attempt.timed_out, error)
        returned = attempt.returned
        progress = self._progress.pop(job.id, None)
        if progress is not None:
            try:
                await self._save_progress(job.id, progress)
            except Exception as exc:  # its savepoint undone; as the worker's writer does
                if not refused(exc):
                    raise
                logger.warning(
                    "Job %d (%s): its progress could not be recorded: %s",
                    job.id,
                    job.task_identifier,
                    one_line(exc),
                )
        outcome = await self._write(ran)
        state = await self._utils.get_job_status(job.id)
        if isinstance(outcome, Failure):
            return RanJob(job, state, outcome.error, outcome.message)
        return RanJob(job, state, None, None, returned)

    async def _reset_session(self) -> None:
        """Undo what the task left on the runner's own session (settings such
        as ``statement_timeout`` or read-only transactions, a role, advisory
        locks, temporary tables), as a worker's pool does before lending a
        connection again: the next writes and jobs start clean. A
        transaction the task left open is rolled back first."""
        conn = self._conn
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.rollback()
        await reset_session(conn)

    async def _end_savepoint(self) -> bool:
        """End the attempt's savepoint: released, or, if a statement of the
        task left the transaction in error, rolled back to (the attempt's
        work undone, the transaction usable: that job fails alone). Whether
        it was rolled back to."""
        conn = self._conn
        failed = conn.info.transaction_status == TransactionStatus.INERROR
        if failed:
            await conn.execute(sessions_sql.ROLLBACK_TO_ATTEMPT_SAVEPOINT)
        await conn.execute(sessions_sql.RELEASE_ATTEMPT_SAVEPOINT)
        return failed

    async def _save_progress(
        self, job_id: int, report: tuple[float, float | None, str | None]
    ) -> None:
        done, total, message = report
        async with _OneConnection(self._conn).connection() as conn:
            await conn.execute(
                self._write_progress,
                {
                    "job_ids": [job_id],
                    "dones": [done],
                    "totals": [total],
                    "messages": [None if message is None else message[:MESSAGE_MAX]],
                },
            )

    async def _write(self, ran: Ran) -> Ran | Failure:
        """Settle ``ran`` and write its outcome, as the worker's reporter and
        completer do (one job a batch)."""
        outcome = self._settler.settle(ran)
        job = outcome.job
        writer = self._writer
        if isinstance(outcome, Failure):
            await writer.write([], [outcome])
            try:
                logs.job_failed(
                    job,
                    outcome.worker_id,
                    self.pool_id,
                    outcome.duration_ms,
                    outcome.message,
                    outcome.error,
                    cancelled=outcome.cancel_reason is not None,
                    timed_out=outcome.on_timeout,
                    for_good=outcome.permanent,
                    delay=outcome.delay,
                )
            except BaseException:  # a user's logging code: the outcome is written already
                logs.outcome_not_logged(job.id)
            return outcome
        if outcome.result is not None or outcome.result_error is not None:
            writer.keep_result(
                job.id, outcome.result, outcome.result_error, step=is_step(job.flags)
            )
        if outcome.logs is not None:
            writer.keep_logs(job, outcome.logs)
        if outcome.timed_out is not None:
            writer.record_timed_out(job.id)
        succeeded = [(job, outcome.worker_id)]
        try:
            await writer.write(succeeded, [])
        finally:
            writer.forget(succeeded)
        return outcome


async def _called(task: Task, job: Job, helpers: Helpers) -> tuple[Any, BaseException | None]:
    """The task's call, a returned awaitable awaited (as the worker does): what
    it returned, or what it raised. ``SystemExit`` and ``KeyboardInterrupt``
    are caught here too: raised out of an asyncio task they stop its event
    loop (the runner's, which every later job needs). A ``CancelledError``
    goes on: :meth:`InlineRunner.call_async` tells a timeout from the rest."""
    try:
        result = await task.function(job.payload, helpers)
        while result is not None and inspect.isawaitable(result):
            result = await result
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, ...: the job failed
        return None, exc
    return result, None
