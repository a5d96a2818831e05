"""What follows a failed attempt: a task's retry policy, and the signals a
task raises to say it itself (snooze, discard, cancel).

::

    @task_options(retry=RetryPolicy(max_attempts=60, backoff="constant", delay=60))
    async def task(payload, helpers):
        if partner_is_busy():
            raise Snooze(30)  # again in 30 s, no attempt spent
        ...

Without a policy the worker writes graphile-worker's own backoff
(``exp(min(attempts, 10))`` seconds after ``greatest(now(), run_at)``), so a
fleet of Node and Python workers agrees. A policy can lower a job's
``max_attempts`` (never raise it: the row's value, set by whoever added the
job, is the upper bound), choose the delay before the next attempt, and say
which errors are never retried (the job is failed for good at once:
``attempts = max_attempts``, revivable with ``reschedule_jobs``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ..errors import rebuilt

if TYPE_CHECKING:
    from ..jobs.job import Job

__all__ = ["Backoff", "Cancel", "Discard", "RetryPolicy", "Snooze", "TaskSignal"]

#: The named delays: ``delay`` seconds times 2 ** (attempts - 1), times
#: attempts, or always ``delay``; or a function of the job (its ``attempts``
#: counts the one that failed) and the error, returning seconds or a timedelta.
Backoff: TypeAlias = (
    Literal["exponential", "linear", "constant"]
    | Callable[["Job", BaseException], "float | timedelta"]
)

#: The longest delay a policy may set: a year (as the longest timeout).
MAX_DELAY = 366 * 86_400.0
#: The most attempts a job can have (max_attempts is a smallint).
_MAX_ATTEMPTS = 32_767


class TaskSignal(Exception):
    """What a task raises to decide what follows its attempt itself (pickled
    as it is: a task in a worker process raises it too)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuilt, (type(self), self.args, self.__dict__)


class Snooze(TaskSignal):
    """Raised by a task: run this job again in ``seconds`` (or a timedelta),
    without spending an attempt; ``last_error`` is left as it was. A task's
    ``RetryPolicy(max_snoozes=N)`` turns the snooze after the N-th into a
    failure."""

    def __init__(self, seconds: float | timedelta) -> None:
        self.seconds = _seconds("Snooze", seconds, minimum=0.0)
        super().__init__(f"snoozed for {self.seconds:g}s")


class Discard(TaskSignal):
    """Raised by a task: fail this job for good now, whatever attempts it has
    left (``reschedule_jobs`` revives it); ``reason`` is its ``last_error``."""

    def __init__(self, reason: str = "discarded") -> None:
        self.reason = reason
        super().__init__(reason)


class Cancel(TaskSignal):
    """Raised by a task: record this job as cancelled (never retried), with
    ``reason``, as ``cancel_job`` would."""

    def __init__(self, reason: str = "cancelled by its task") -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A task's retry policy (see the module's docstring). A bad value raises
    ValueError when the policy is made (when the task's module is imported)."""

    #: The most attempts a job of this task gets; the row's ``max_attempts``
    #: still bounds it (None: the row's alone).
    max_attempts: int | None = None
    #: The delay before the next attempt (None: graphile-worker's formula).
    backoff: Backoff | None = None
    #: Seconds (or a timedelta): the named backoffs' base.
    delay: float | timedelta = 1.0
    #: Seconds (or a timedelta): no delay is longer (None: a year).
    max_delay: float | timedelta | None = None
    #: A fraction: each delay is multiplied by a random factor in
    #: [1 - jitter, 1 + jitter] (0: none), so retries do not come in step.
    jitter: float = 0.0
    #: Only these errors are retried (empty: every error).
    retry_on: tuple[type[BaseException], ...] = ()
    #: These errors are never retried (they win over ``retry_on``).
    dont_retry_on: tuple[type[BaseException], ...] = ()
    #: The most times a job may snooze; the next ``Snooze`` fails the attempt
    #: (None: no bound).
    max_snoozes: int | None = None

    def __post_init__(self) -> None:
        # A bool is an int to Python (True == 1), never a count or a fraction here.
        if self.max_attempts is not None and not (
            _whole(self.max_attempts) and 1 <= self.max_attempts <= _MAX_ATTEMPTS
        ):
            raise ValueError(
                f"RetryPolicy: max_attempts must be a whole number from 1 to {_MAX_ATTEMPTS}, "
                f"not {self.max_attempts!r}"
            )
        named = ("exponential", "linear", "constant")
        if self.backoff is not None and not callable(self.backoff) and self.backoff not in named:
            raise ValueError(
                "RetryPolicy: backoff must be 'exponential', 'linear', 'constant' or a "
                f"function of (job, error), not {self.backoff!r}"
            )
        object.__setattr__(self, "delay", _seconds("RetryPolicy: delay", self.delay))
        if self.max_delay is not None:
            limit = _seconds("RetryPolicy: max_delay", self.max_delay)
            object.__setattr__(self, "max_delay", limit)
        if not (
            isinstance(self.jitter, int | float)
            and not isinstance(self.jitter, bool)
            and 0.0 <= self.jitter <= 1.0
        ):
            raise ValueError(f"RetryPolicy: jitter must be from 0 to 1, not {self.jitter!r}")
        for name in ("retry_on", "dont_retry_on"):
            value = getattr(self, name)
            if isinstance(value, type):
                value = (value,)
                object.__setattr__(self, name, value)
            if not isinstance(value, tuple) or not all(
                isinstance(kind, type) and issubclass(kind, BaseException) for kind in value
            ):
                raise ValueError(f"RetryPolicy: {name} must be a tuple of exception classes")
        if self.max_snoozes is not None and not (
            _whole(self.max_snoozes) and self.max_snoozes >= 0
        ):
            raise ValueError(
                f"RetryPolicy: max_snoozes must be a whole number from 0, not {self.max_snoozes!r}"
            )

    def retries(self, error: BaseException) -> bool:
        """Whether a failure with ``error`` may be retried (attempts allowing)."""
        if self.dont_retry_on and isinstance(error, self.dont_retry_on):
            return False
        return not self.retry_on or isinstance(error, self.retry_on)

    def last_attempt(self, job: Job) -> bool:
        """The attempt that failed was this job's last (the policy's bound)."""
        return self.max_attempts is not None and job.attempts >= self.max_attempts

    def delay_for(self, job: Job, error: BaseException) -> float | None:
        """Seconds before the next attempt (None: graphile-worker's formula).
        A backoff function that fails or returns something else than a
        duration raises ValueError, naming what it returned."""
        backoff = self.backoff
        if backoff is None:
            return None
        assert isinstance(self.delay, float)
        if callable(backoff):
            seconds = _seconds("the backoff function's delay", backoff(job, error), minimum=0.0)
        elif backoff == "exponential":
            seconds = self.delay * 2.0 ** min(job.attempts - 1, 64)
        elif backoff == "linear":
            seconds = self.delay * job.attempts
        else:
            seconds = self.delay
        if self.jitter:
            seconds *= random.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        limit = MAX_DELAY if self.max_delay is None else self.max_delay
        assert isinstance(limit, float)  # __post_init__ made it seconds
        return max(0.0, min(seconds, limit))


def _whole(value: object) -> bool:
    """A whole number: an int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(name: str, value: object, *, minimum: float = 0.001) -> float:
    """``value`` (seconds, or a timedelta) as seconds, checked."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be seconds (a number or a timedelta), not {value!r}")
    if not minimum <= value <= MAX_DELAY:
        raise ValueError(f"{name} must be from {minimum:g} to {MAX_DELAY:g} seconds, not {value!r}")
    return float(value)
