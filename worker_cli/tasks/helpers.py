"""What a task receives besides its payload: the job, a logger, the database."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import cached_property
from typing import Any, TypeVar, overload

import psycopg
from psycopg.rows import dict_row

from ..client.worker_utils import WorkerUtils
from ..errors import JobCancelled, JobTimeout
from ..jobs.job import Job
from ..jobs.payloads import NamedPayload, job_identity
from ..jobs.unique import UniqueJobResult, UniqueSpec
from ..jobs.workflow import Workflow, WorkflowError, is_step
from ..jobs.workflow_state import ParentOutcome, StepContext
from .attempt_log import AttemptLog
from .operation_limits import Holds, OperationLimit, refuse_on_loop

__all__ = ["MESSAGE_MAX", "Helpers", "JobLogger", "ProcessRunner", "ProgressSink", "check_progress"]

T = TypeVar("T")

#: Where ``helpers.progress`` reports go: (job id, done, total, message).
ProgressSink = Callable[[int, float, "float | None", "str | None"], None]

#: Runs a ``process=True`` task's job in one of the worker's processes:
#: (task identifier, payload, helpers) -> what the task returned.
ProcessRunner = Callable[[str, Any, "Helpers"], Awaitable[Any]]

#: The longest progress message kept, in characters (a longer one is cut).
MESSAGE_MAX = 1000


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose lines start with ``[job(worker-…: task{id})]``; the records
    also carry ``worker_id``, ``task_identifier``, ``job_id``, ``attempt`` and
    ``max_attempts`` as attributes (fields of ``--log-format json``). With
    ``capture``, the lines it logs are also kept for the attempt
    (``--job-logs``: :mod:`~worker_cli.tasks.attempt_log`)."""

    capture: AttemptLog | None = None

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        capture = self.capture
        # INFO and above whatever the output's level (kept for the attempt
        # even where the process prints only warnings); DEBUG when printed.
        if capture is not None and (level >= logging.INFO or self.isEnabledFor(level)):
            capture.add(level, msg, args, kwargs.get("exc_info"))
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        prefix = f"[job({extra['worker_id']}: {extra['task_identifier']}{{{extra['job_id']}}})]"
        kwargs["extra"] = {**extra, **kwargs["extra"]} if kwargs.get("extra") else extra
        return f"{prefix} {msg}", kwargs


class Helpers:
    """Per-job helpers, passed to ``task(payload, helpers)``.

    - ``job``: the job being run (read-only; ``job.id``, ``job.attempts``, ...)
    - ``logger``: a logger whose lines name the worker, the task and the job
    - ``abort_signal``: an ``asyncio.Event`` set when the job must stop
      (graceful-shutdown timeout); check ``abort_signal.is_set()``
    - ``cancelled``, ``raise_if_cancelled()``, ``cancel_reason``: the job was
      cancelled while running (``cancel_job``), or its timeout has passed
      (``timed_out``)
    - ``with_pg_client()``, ``query(sql, params)``: the worker's database pool
    - ``add_job(...)``, ``add_jobs(...)``: as in WorkerUtils
    - ``run(awaitable)``: from a plain (threaded) task, run one of the above on
      the worker's event loop and return its result
    - ``limit(name, partition)``: a block within an operation limit
    - ``progress(done, total=None, message=None)``: how far the job has got
      (shown by ``graphile-worker job ID``, the dashboard, ``get_job_result``)
    - ``workflow_id``, ``step_ref``, ``parents``: a workflow step's workflow,
      its name in it, and its parents' outcomes; ``add_steps(workflow)``: add
      steps to its workflow (dynamic fan-out)
    """

    #: A cancel request came (``mark_cancelled``), and the timeout (seconds)
    #: once it has passed (``mark_timed_out``): class defaults, set per job
    #: only when they happen.
    _requested = False
    _timed_out: float | None = None
    #: The job's open ``limit`` blocks (nested ones hold one slot), made at
    #: its first ``limit`` (a job costs nothing more without one).
    _holds: Holds | None = None
    #: The worker's processes, for ``process=True`` tasks (None: none).
    processes: ProcessRunner | None = None

    def __init__(
        self,
        job: Job,
        *,
        worker_id: str,
        utils: WorkerUtils,
        abort_signal: asyncio.Event,
        loop: asyncio.AbstractEventLoop | None = None,
        step: StepContext | None = None,
        progress: ProgressSink | None = None,
        capture_logs: bool = False,
        processes: ProcessRunner | None = None,
    ) -> None:
        self.job = job
        if processes is not None:
            self.processes = processes
        self._step = step
        self._progress = progress
        self._capture_logs = capture_logs
        #: The attempt's kept log lines (made with the logger, when kept).
        self.attempt_log: AttemptLog | None = None
        self.worker_id = worker_id
        self.abort_signal = abort_signal
        self._utils = utils
        #: ``add_jobs(specs, ...)``: WorkerUtils.add_jobs itself (``unique``
        #: included), typed as it is there.
        self.add_jobs = utils.add_jobs
        self._loop = loop or asyncio.get_running_loop()
        self._cancelled = False
        #: Why the job was cancelled (``cancel_job(..., reason)``), once it
        #: was; ``timed out after 30s`` once its timeout has passed.
        self.cancel_reason: str | None = None

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled while running (``cancel_job``), or
        its timeout has passed: a plain ``def`` task should check it between
        steps and stop (an ``async def`` task gets ``CancelledError`` at its
        next ``await``)."""
        return self._cancelled

    @property
    def timed_out(self) -> bool:
        """True once the job's timeout has passed (see :attr:`cancelled`)."""
        return self._timed_out is not None

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~worker_cli.errors.JobCancelled` if the job was
        cancelled, :class:`~worker_cli.errors.JobTimeout` if its timeout has
        passed."""
        if self._cancelled:
            if self._timed_out is not None and not self._requested:
                raise JobTimeout(self._timed_out)
            raise JobCancelled(self.cancel_reason)

    def mark_cancelled(self, reason: str | None) -> None:
        """Called by the worker (any thread) when the job is cancelled."""
        self.cancel_reason = reason
        self._requested = True
        self._cancelled = True

    def mark_timed_out(self, timeout: float) -> None:
        """Called by the worker (any thread) when the job's timeout has passed."""
        self._timed_out = timeout
        if not self._requested:
            self.cancel_reason = f"timed out after {timeout:g}s"
        self._cancelled = True

    @cached_property
    def logger(self) -> JobLogger:
        """A logger whose lines name the worker, the task and the job (made on first use)."""
        job = self.job
        logger = JobLogger(
            logging.getLogger("graphile_worker.job"),
            {
                "worker_id": self.worker_id,
                "task_identifier": job.task_identifier,
                "job_id": job.id,
                "attempt": job.attempts,
                "max_attempts": job.max_attempts,
            },
        )
        if self._capture_logs:
            logger.capture = self.attempt_log = AttemptLog()
        return logger

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the job has got: ``done`` of ``total`` (``done`` a
        fraction from 0 to 1 when ``total`` is None), with an optional
        ``message``. Call it as often as you like, from an ``async def`` or a
        plain task: the worker writes each job's latest report at most twice
        a second, beside the job (kept across retries, and with its history).
        Raises ValueError naming the argument for a value that is not one."""
        check_progress(done, total, message)
        if self._progress is not None:
            self._progress(self.job.id, done, total, message)

    @property
    def workflow_id(self) -> int | None:
        """The id of the workflow this job is a step of (None: not a step)."""
        if self._step is None:
            self._no_step_context()
            return None
        return self._step.workflow_id

    @property
    def step_ref(self) -> str | None:
        """This step's name in its workflow (None: not a step)."""
        if self._step is None:
            self._no_step_context()
            return None
        return self._step.ref

    @property
    def parents(self) -> Mapping[str, ParentOutcome]:
        """Each parent step's ref -> its outcome (``state``, ``result``,
        ``error``), read with the job (empty: a root step, or not a step)."""
        if self._step is None:
            self._no_step_context()
            return {}
        return self._step.parents

    def _no_step_context(self) -> None:
        """Not a step; or a step whose context could not be read with its job
        (the job fails, and is retried)."""
        if is_step(self.job.flags):
            raise RuntimeError(
                f"job {self.job.id} is a workflow step, but its workflow could not be read "
                "when it was fetched (see the worker's log); it is retried"
            )

    async def add_steps(self, workflow: Workflow, *, hold_dependents: bool = False) -> int:
        """Add the steps of ``workflow`` to this step's workflow (dynamic
        fan-out), in one statement: its steps with no parent in it wait for
        this step (they start once it succeeds, as its children); with
        ``hold_dependents``, this step's own children also wait for the new
        steps (for those no new step waits for). Refs must be new to the
        workflow. Returns how many were added; raises
        :class:`~worker_cli.jobs.workflow.WorkflowError` naming what is wrong."""
        step = self._step
        if step is None:
            self._no_step_context()
            raise WorkflowError("add_steps", "this job is not a workflow step")
        return await self._utils.extend_workflow(
            step.workflow_id, step.ref, workflow, hold_dependents
        )

    def get_queue_name(self) -> str | None:
        """The name of the job's queue, or None."""
        return self.job.queue_name

    @asynccontextmanager
    async def with_pg_client(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the worker's pool for the duration of the block.

        Helpers called inside the block (``query``, ``add_job``, a nested
        ``with_pg_client``) use this same connection, and so any transaction open
        on it, instead of waiting for another from a pool that may be exhausted.
        """
        async with self._utils.holding_connection() as conn:
            yield conn

    async def query(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run one statement on the worker's pool; returns its rows as dicts."""
        async with self._utils.connection() as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(sql, params)
            return await cur.fetchall() if cur.description else []

    @overload
    async def add_job(
        self, identifier: str, payload: Any = None, *, unique: None = None, **options: Any
    ) -> Job: ...

    @overload
    async def add_job(
        self, identifier: str, payload: Any = None, *, unique: UniqueSpec, **options: Any
    ) -> UniqueJobResult: ...

    @overload
    async def add_job(
        self, payload: NamedPayload, /, *, unique: None = None, **options: Any
    ) -> Job: ...

    @overload
    async def add_job(
        self, payload: NamedPayload, /, *, unique: UniqueSpec, **options: Any
    ) -> UniqueJobResult: ...

    # mypy: with **options, the overloads taking the payload first would also
    # take identifier= as an option; the implementation refuses that, as it should.
    async def add_job(  # type: ignore[misc]
        self,
        identifier: str | NamedPayload,
        payload: Any = None,
        *,
        unique: UniqueSpec | None = None,
        **options: Any,
    ) -> Job | UniqueJobResult:
        """Add a job (options as WorkerUtils.add_job, ``unique`` included); a
        payload whose class names its task needs no identifier."""
        identifier, payload = job_identity(identifier, payload)
        if unique is None:
            job: Job = await self._utils.add_job(identifier, payload, **options)
            return job
        result: UniqueJobResult = await self._utils.add_job(
            identifier, payload, unique=unique, **options
        )
        return result

    def limit(self, name: str, partition: Any = None) -> OperationLimit:
        """``async with helpers.limit("stripe", partition=...)`` (``with`` in a
        plain task): the block runs within the operation limit ``name``
        (``set_limit(Limit(...), operation=name)``), or the job snoozes until
        it may (see :mod:`~worker_cli.tasks.operation_limits`). Blocks of one
        name and partition nested in the job hold one slot and count one start."""
        if self._holds is None:
            self._holds = Holds()
        return OperationLimit(
            self._utils,
            self._loop,
            name=name,
            partition=partition,
            holder=self.job.id,
            holds=self._holds,
        )

    def run(self, awaitable: Awaitable[T]) -> T:
        """From a plain task's thread: run ``awaitable`` on the worker's loop, wait
        for it. On the loop's own thread (an ``async def`` task) it raises
        ``RuntimeError`` at once: there it would wait for ever (``await`` it)."""
        try:
            refuse_on_loop(
                self._loop,
                "helpers.run() waits for the worker's event loop, and this is that "
                "loop's own thread (an async def task); write 'await ...' instead",
            )
        except RuntimeError:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never awaited, and no warning saying so
            raise

        async def wrapper() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result()


#: Numbers progress takes (bool, an int subclass, is none), and the largest.
_NUMBER = (int, float)
_LARGEST = 1.7e308


def check_progress(done: float, total: float | None, message: str | None) -> None:
    """Raise ValueError naming the argument of ``helpers.progress`` that is wrong."""
    # The checks cost a few comparisons: a task may call this in a tight
    # loop (the message is made storable when written, at most twice a second).
    if not (
        type(done) in _NUMBER
        and 0 <= done <= (1 if total is None else _LARGEST)
        and (total is None or (type(total) in _NUMBER and 0 <= total <= _LARGEST))
        and (message is None or isinstance(message, str))
    ):
        _refuse_progress(done, total, message)


def _refuse_progress(done: object, total: object, message: object) -> None:
    """Raise ValueError naming the argument of ``progress`` that is wrong."""
    _check_number("done", done)
    if total is None:
        if not 0 <= done <= 1:  # type: ignore[operator]
            raise ValueError(f"done is {done!r}: without a total, done is a fraction from 0 to 1")
    else:
        _check_number("total", total)
    if message is not None and not isinstance(message, str):
        raise ValueError(f"message is {message!r}; it must be a string or None")


def _check_number(name: str, value: object) -> None:
    """A progress count: a finite number, 0 or more (NaN, infinities and an
    int past float's range are none)."""
    if type(value) not in _NUMBER or not 0 <= value <= _LARGEST:  # type: ignore[operator]
        raise ValueError(f"{name} is {value!r}; it must be a finite number, 0 or more")
