"""The statements that write a pool's results, for the completer.

Successes delete their jobs, and with history on record them in
``_private_py_job_history`` with their results, in the same statement (one
commit for both; :data:`~worker_cli.sql.completion.COMPLETE_BATCH`).
Failures record their errors and back off. Either statement ends with one
NOTIFY listing the batch's jobs that someone waits for (``wait_for_job``;
none when nobody waits). Writing is idempotent: a batch retried after a lost
connection rewrites nothing (it may notify again, which a waiter shrugs off).

A result the server refuses for what it holds (a user's trigger raising, a
value out of range), or that the client library cannot send (a value it
cannot adapt or encode: :func:`refused`), is never retried for ever, and
never holds up the others:
the batch is written in halves down to the refused job alone
(:meth:`ResultWriter.write`). A refused success is written again without its
result; if that is refused too, or for a refused failure, the job is failed
for good with a message saying why. Other errors (a lost connection, a
failover) go back to the caller, which retries the whole batch.

Workflow steps (jobs with the step flag, :func:`~worker_cli.jobs.workflow.is_step`):
a batch holding some is written in one transaction with their steps'
outcomes, and their workflows advance in it (their children's jobs added,
or ended): successes record their steps first (``py_workflow_settle`` with
their results), then the success statement; failures lock their workflows
first, then the failure statements, then read their steps' outcomes from
the rows those left (failed for good, cancelled, or retried: not final). A
batch without steps is written as before, with no statement more.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from ...jobs.job import Job
from ...jobs.last_error import describe, storable
from ...jobs.workflow import is_step
from ...schema import channels
from ...sql import cancel as cancel_sql
from ...sql import completion as completion_sql
from ...sql import compose
from ...sql import failure as failure_sql
from ...sql import job_logs as job_logs_sql
from ...sql import workflows as workflows_sql
from .outcome import Failure

__all__ = ["Connections", "HistorySettings", "ResultWriter", "refused"]

logger = logging.getLogger("graphile_worker")

#: SQLSTATE classes of errors that refuse a statement for the values it holds,
#: which the same statement would meet again: data exceptions (22), integrity
#: constraints (23), program limits (54), a trigger's or function's own error
#: (P0, 38, 39, 2F), triggered data change (27), a check option (44). Any
#: other error (a lost connection, a read-only standby after a failover, a
#: revoked privilege) is retried with the whole batch.
_REFUSALS = frozenset({"22", "23", "27", "2F", "38", "39", "44", "54", "P0"})

Succeeded = list[tuple[Job, str]]


#: What psycopg raises for a value it cannot send, before the server sees the
#: statement: a type it cannot adapt (ProgrammingError), a NUL in text
#: (DataError), a lone surrogate (UnicodeEncodeError, a ValueError), an int
#: out of range (DataError, OverflowError).
_UNSENDABLE = (psycopg.DataError, psycopg.ProgrammingError, ValueError, TypeError, OverflowError)


def refused(error: BaseException) -> bool:
    """A statement was refused for the values it holds: by the server (see
    ``_REFUSALS``), or by the client library before sending it (see
    ``_UNSENDABLE``). Sending it again would meet the same refusal."""
    if isinstance(error, psycopg.Error):
        state = error.sqlstate
        if state is None:
            return isinstance(error, _UNSENDABLE)
        return state[:2] in _REFUSALS
    return isinstance(error, _UNSENDABLE)


class Connections(Protocol):
    """Where the writer gets a connection for each write: the pool's
    (``psycopg_pool.AsyncConnectionPool``), or one connection
    (:mod:`worker_cli.testing`'s, each write in a savepoint of its own)."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...


@dataclass(frozen=True)
class HistorySettings:
    """History on: how long a success is kept."""

    keep_succeeded: timedelta


class ResultWriter:
    """Writes the results of one pool (see the module's docstring)."""

    def __init__(
        self,
        db: Connections,
        *,
        schema: str,
        pool_id: str,
        history: HistorySettings | None,
        success_logs: bool = False,
    ) -> None:
        self._db = db
        self._pool_id = pool_id
        self._history = history
        self._complete = compose(completion_sql.COMPLETE_BATCH, schema)
        self._fail = compose(failure_sql.FAIL_BATCH, schema)
        self._return = compose(failure_sql.RETURN_JOBS, schema)
        self._record_cancelled = compose(cancel_sql.RECORD_CANCELLED, schema)
        #: Where the waiters of finished jobs are told (wait_for_job).
        self._channel = channels.finished_channel(schema)
        self._request_cancels = compose(cancel_sql.REQUEST_CANCELS, schema)
        self._settle_succeeded = compose(workflows_sql.SETTLE_SUCCEEDED, schema)
        self._settle = compose(workflows_sql.SETTLE, schema)
        self._lock_workflows = compose(workflows_sql.LOCK_WORKFLOWS, schema)
        #: Results of succeeded jobs waiting to be written: job id -> (JSON
        #: text, why it was not kept); only jobs that returned something.
        self._results: dict[int, tuple[str | None, str | None]] = {}
        #: Succeeded jobs waiting to be written that went past their timeout.
        self._timed_out: set[int] = set()
        #: Successes keep their attempts' log lines (--job-logs all): job id
        #: -> (attempt, text, lines dropped), written with their success.
        self._success_logs = success_logs
        self._logs: dict[int, tuple[int, str, int]] = {}
        self._record_logs = compose(job_logs_sql.RECORD_SUCCESS_LOGS, schema)

    @property
    def keeps_results(self) -> bool:
        """History is on: results are worth encoding."""
        return self._history is not None

    def keep_result(
        self, job_id: int, result: str | None, error: str | None, *, step: bool = False
    ) -> None:
        """The result of a job that succeeded, to be written with its success
        (with history on; a workflow step's, whose children read it, always)."""
        if (self._history is not None or step) and (result is not None or error is not None):
            self._results[job_id] = (result, error)

    def keep_logs(self, job: Job, logs: tuple[str, int]) -> None:
        """The log lines of a job that succeeded, to be written with its
        success (--job-logs all; else dropped: a success costs nothing)."""
        if self._success_logs:
            self._logs[job.id] = (job.attempts, *logs)

    def record_timed_out(self, job_id: int) -> None:
        """A job that succeeded after its timeout: its history says so."""
        if self._history is not None:
            self._timed_out.add(job_id)

    def forget(self, succeeded: Succeeded) -> None:
        """The results of these jobs are written (or never will be)."""
        if self._results:
            for job, _ in succeeded:
                self._results.pop(job.id, None)
        if self._timed_out:
            self._timed_out.difference_update(job.id for job, _ in succeeded)
        if self._logs:
            for job, _ in succeeded:
                self._logs.pop(job.id, None)

    async def write(self, succeeded: Succeeded, failed: list[Failure]) -> None:
        """Write the results; if the server refuses them for what they hold,
        write them in halves, down to the refused job alone."""
        try:
            await self._write(succeeded, failed)
            return
        except Exception as exc:
            if not refused(exc):
                raise
            if len(succeeded) + len(failed) == 1:
                await self._record_refused(succeeded, failed, exc)
                return
        half_s, half_f = len(succeeded) // 2, len(failed) // 2
        if not (half_s or half_f):  # one success and one failure
            half_s = len(succeeded)
        await self.write(succeeded[:half_s], failed[:half_f])
        await self.write(succeeded[half_s:], failed[half_f:])

    async def _record_refused(
        self, succeeded: Succeeded, failed: list[Failure], error: Exception
    ) -> None:
        """One job's outcome was refused. A success is written again without
        its result; otherwise the job is failed for good, with a message of
        ours (``reschedule_jobs`` runs it again). If even that is refused, the
        job is left locked (the stale-lock sweep frees it)."""
        refusal = _refusal(error)
        if succeeded:
            job, worker_id = succeeded[0]
            what, cause = "success", None
            if job.id in self._results:
                self._results[job.id] = (None, refusal)
                try:
                    await self._write(succeeded, [])
                    logger.warning(
                        "Job %d (%s): its result could not be recorded (%s); recorded the "
                        "success without it",
                        job.id,
                        job.task_identifier,
                        refusal,
                    )
                    return
                except Exception as exc:
                    if not refused(exc):
                        raise
        else:
            job, worker_id, cause = failed[0].job, failed[0].worker_id, failed[0].error
            what = "failure"
        message = storable(f"the worker could not record this job's {what}: {refusal}")
        fallback = Failure(job, worker_id, cause or RuntimeError(message), message)
        fallback.permanent = True
        try:
            await self._write([], [fallback])
        except Exception as exc:
            if not refused(exc):
                raise
            logger.error(
                "Job %d: its %s could not be recorded (%s), nor its failure (%s): "
                "it stays locked until the stale-lock sweep frees it",
                job.id,
                what,
                refusal,
                _refusal(exc),
            )
            return
        logger.warning(
            "Job %d (%s): the worker could not record its %s (%s); "
            "failed it for good instead (reschedule_jobs runs it again)",
            job.id,
            job.task_identifier,
            what,
            refusal,
        )

    async def _write(self, succeeded: Succeeded, failed: list[Failure]) -> None:
        async with self._db.connection() as conn:
            if succeeded:
                steps = [job.id for job, _ in succeeded if is_step(job.flags)]
                if steps:
                    results = self._results
                    async with conn.transaction():
                        await conn.execute(
                            self._settle_succeeded,
                            {
                                "job_ids": steps,
                                "results": [results.get(i, (None, None))[0] for i in steps],
                            },
                        )
                        await self._complete_batch(conn, succeeded)
                else:
                    await self._complete_batch(conn, succeeded)
            if failed:
                params = {
                    "job_ids": [f.job.id for f in failed],
                    "messages": [f.message for f in failed],
                    "items": [_int_array(f.failed_items) for f in failed],
                    "permanent": [f.permanent for f in failed],
                    "timed_out": [f.timed_out for f in failed],
                    "delays": [f.delay for f in failed],
                    "snoozes": [f.snooze for f in failed],
                    "max_snoozes": [f.max_snoozes for f in failed],
                    "tracebacks": [f.traceback for f in failed],
                    "logs": [None if f.logs is None else f.logs[0] for f in failed],
                    "logs_dropped": [None if f.logs is None else f.logs[1] for f in failed],
                    "pool_id": self._pool_id,
                    "channel": self._channel,
                }
                cancels = [f for f in failed if f.cancel]
                steps = [f.job.id for f in failed if is_step(f.job.flags)]
                # The failures, then those of jobs with a cancel request
                # recorded as cancelled, in one transaction (with their
                # steps' outcomes, their workflows locked first).
                async with conn.transaction():
                    if steps:
                        await conn.execute(self._lock_workflows, {"job_ids": steps})
                    if cancels:
                        # on_timeout="cancel": a cancel request first, so that
                        # the failure is recorded as cancelled.
                        await conn.execute(
                            self._request_cancels,
                            {
                                "job_ids": [f.job.id for f in cancels],
                                "reasons": [
                                    f.cancel_reason or f"timed out ({f.message})" for f in cancels
                                ],
                                "pool_id": self._pool_id,
                            },
                        )
                    await conn.execute(self._fail, params)
                    await conn.execute(
                        self._record_cancelled,
                        {
                            "job_ids": params["job_ids"],
                            "messages": params["messages"],
                            "timed_out": [f.job.id for f in failed if f.timed_out],
                            "pool_id": self._pool_id,
                        },
                    )
                    if steps:
                        await conn.execute(self._settle, {"job_ids": steps})

    async def give_back(self, job_ids: list[int]) -> None:
        """Give back jobs that were fetched but never started, their attempt
        restored; one with a cancel request is recorded as cancelled (never
        run). One transaction, in which a cancelled step's workflow advances."""
        async with self._db.connection() as conn, conn.transaction():
            params = {"job_ids": job_ids, "pool_id": self._pool_id}
            await conn.execute(self._lock_workflows, {"job_ids": job_ids})
            await conn.execute(self._return, params)
            await conn.execute(
                self._record_cancelled, {**params, "messages": None, "timed_out": []}
            )
            await conn.execute(self._settle, {"job_ids": job_ids})

    async def _complete_batch(
        self, conn: psycopg.AsyncConnection[Any], succeeded: Succeeded
    ) -> None:
        """The success statement; with logs to keep (--job-logs all), and
        them, in one transaction."""
        logs = self._logs
        kept = [(job.id, logs[job.id]) for job, _ in succeeded if job.id in logs] if logs else []
        if not kept:
            await conn.execute(self._complete, self._complete_params(succeeded))
            return
        async with conn.transaction():
            await conn.execute(self._complete, self._complete_params(succeeded))
            await conn.execute(
                self._record_logs,
                {
                    "job_ids": [job_id for job_id, _ in kept],
                    "attempts": [entry[0] for _, entry in kept],
                    "lines": [entry[1] for _, entry in kept],
                    "dropped": [entry[2] for _, entry in kept],
                },
            )

    def _complete_params(self, succeeded: Succeeded) -> dict[str, Any]:
        history = self._history
        results = self._results
        kept = [(job.id, results[job.id]) for job, _ in succeeded if job.id in results]
        timed_out = self._timed_out
        return {
            "job_ids": [job.id for job, _ in succeeded],
            "pool_id": self._pool_id,
            "channel": self._channel,
            "any_queued": any(job.job_queue_id is not None for job, _ in succeeded),
            "record": history is not None,
            "keep": None if history is None else history.keep_succeeded,
            "result_ids": [job_id for job_id, _ in kept],
            "results": [result for _, (result, _) in kept],
            "result_errors": [error for _, (_, error) in kept],
            "timed_out": (
                [job.id for job, _ in succeeded if job.id in timed_out] if timed_out else []
            ),
        }


def _refusal(error: Exception) -> str:
    """Who refused a statement and why, on one line (storable): ``PostgreSQL
    refused it (SQLSTATE: message)``, or the client library's refusal to send
    a value."""
    if isinstance(error, psycopg.Error) and error.sqlstate is not None:
        return storable(f"PostgreSQL refused it ({error.sqlstate}: {' '.join(str(error).split())})")
    return storable(f"it could not be sent to PostgreSQL ({' '.join(describe(error).split())})")


def _int_array(items: list[int] | None) -> str | None:
    """A batch job's failed items as an ``int[]`` literal (None: all of it)."""
    return None if items is None else "{" + ",".join(map(str, items)) + "}"
