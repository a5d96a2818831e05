"""Per-task settings, declared beside the task function.

::

    @task_options(timeout=30, on_timeout="retry", on_stuck="wait")
    async def task(payload, helpers): ...

The decorator stores a frozen :class:`TaskOptions` on the function (the
function itself is returned unchanged, and wrappers made with
``functools.wraps`` keep it); the task loader reads it into
:attr:`Task.options <worker_cli.tasks.loader.Task.options>`, for task files,
``task_list`` functions and typed tasks alike. A function without the
decorator has :data:`DEFAULT_TASK_OPTIONS`: no timeout, as in graphile-worker.

This is the one home of per-task settings: new ones (a retry policy, say)
are new fields of :class:`TaskOptions` and new keywords of :func:`task_options`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeAlias, TypeVar, get_args

from ..jobs.job_spec import check_timeout
from ..jobs.limit_spec import Limit
from .retry_policy import RetryPolicy

__all__ = [
    "DEFAULT_TASK_OPTIONS",
    "OnStuck",
    "OnTimeout",
    "TaskOptions",
    "options_of",
    "task_options",
]

#: What a timed-out attempt comes to: a failure retried with backoff like any
#: other, a permanent failure now, or a cancelled job.
OnTimeout: TypeAlias = Literal["retry", "fail", "cancel"]
#: What a plain ``def`` task still running ``timeout_grace`` after its timeout
#: leads to: keep its slot and its lock (it is never run twice), or stop the
#: worker once its other jobs are done, exiting with code 75.
OnStuck: TypeAlias = Literal["wait", "exit"]

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute of a task function that holds its options.
_ATTRIBUTE = "__graphile_worker_task_options__"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOptions:
    """The settings of one task (see :func:`task_options`)."""

    #: Seconds each attempt may run, counted from the task call (None: no
    #: limit). A job's own ``add_job(..., timeout=...)`` wins over it.
    timeout: float | None = None
    on_timeout: OnTimeout = "retry"
    on_stuck: OnStuck = "wait"
    #: What follows a failed attempt (None: graphile-worker's backoff).
    retry: RetryPolicy | None = None
    #: The task's fleet-wide limit, written to the database when a worker
    #: running it starts (None: whatever the database holds, if anything).
    limit: Limit | None = None
    #: Run each job in one of the worker's processes (``--processes``), not a
    #: thread: for CPU-bound plain ``def`` tasks.
    process: bool = False

    def __post_init__(self) -> None:
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"task_options: retry must be a RetryPolicy, not {self.retry!r}")
        if self.limit is not None and not isinstance(self.limit, Limit):
            raise ValueError(f"task_options: limit must be a Limit, not {self.limit!r}")
        timeout = check_timeout(self.timeout)
        # Kept in seconds: the worker arms timers with it.
        object.__setattr__(self, "timeout", None if timeout is None else timeout.total_seconds())
        _check_choice("on_timeout", self.on_timeout, get_args(OnTimeout))
        _check_choice("on_stuck", self.on_stuck, get_args(OnStuck))
        if not isinstance(self.process, bool):
            raise ValueError(f"task_options: process must be True or False, not {self.process!r}")


def task_options(
    *,
    timeout: float | timedelta | None = None,
    on_timeout: OnTimeout = "retry",
    on_stuck: OnStuck = "wait",
    retry: RetryPolicy | None = None,
    limit: Limit | None = None,
    process: bool = False,
) -> Callable[[F], F]:
    """Declare a task's settings beside its function::

        @task_options(timeout=30)  # seconds, or a timedelta
        def task(payload, helpers): ...

    - ``timeout``: each attempt may run this long, counted from the task
      call (time spent queued does not count); None (the default): no limit.
      An ``async def`` task is cancelled at the timeout; a plain ``def`` one
      sees ``helpers.cancelled`` become true. Either way a task that then
      raises fails its attempt with ``JobTimeout: exceeded 30s``.
    - ``on_timeout``: ``"retry"`` (a failure like any other, retried with
      backoff), ``"fail"`` (failed for good now) or ``"cancel"`` (recorded
      as cancelled).
    - ``on_stuck``: for a plain ``def`` task still running ``timeout_grace``
      seconds after its timeout: ``"wait"`` (keep its slot and lock; it is
      never run twice) or ``"exit"`` (the worker stops fetching, finishes its
      other jobs and exits with code 75; the job runs again once the worker
      is gone).
    - ``retry``: a :class:`~worker_cli.tasks.retry_policy.RetryPolicy`: its most
      attempts, the delay before the next one, which errors are never
      retried; None (the default): graphile-worker's backoff.
    - ``limit``: a :class:`~worker_cli.jobs.limit_spec.Limit` on this task across
      every Python worker (at most N running at once, at most N starts per
      period, per payload field value); written to the database as a worker
      running the task starts, replacing what was stored there (the last
      writer wins, with a warning when they differ).
    - ``process``: run each job of this plain ``def`` task in one of the
      worker's child processes (``--processes``) instead of a thread, so that
      CPU-bound tasks use every core. The task must be a module-level plain
      ``def``; its payload, return value and exceptions cross a pipe
      (pickled); its helpers are ``job``, ``logger`` and ``progress`` only. A
      timeout or a cancel request kills its process (a new one replaces it).

    A bad value raises ValueError at once (when the task's module is imported).
    """
    options = TaskOptions(
        timeout=None if timeout is None else _seconds(timeout),
        on_timeout=on_timeout,
        on_stuck=on_stuck,
        retry=retry,
        limit=limit,
        process=process,
    )

    def decorate(function: F) -> F:
        try:
            setattr(function, _ATTRIBUTE, options)
        except AttributeError:
            raise TypeError(
                f"task_options: cannot set options on {function!r}; decorate the function itself"
            ) from None
        return function

    return decorate


def options_of(function: object) -> TaskOptions:
    """The options declared on a task function (:data:`DEFAULT_TASK_OPTIONS` if none)."""
    options = getattr(function, _ATTRIBUTE, None)
    return options if isinstance(options, TaskOptions) else DEFAULT_TASK_OPTIONS


def _seconds(timeout: float | timedelta) -> float:
    checked = check_timeout(timeout)
    assert checked is not None
    return checked.total_seconds()


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"task_options: {name} must be one of {', '.join(map(repr, choices))}, not {value!r}"
        )


#: The options of a task declared without :func:`task_options`: no timeout.
DEFAULT_TASK_OPTIONS = TaskOptions()
