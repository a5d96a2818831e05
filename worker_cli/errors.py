"""Exceptions raised by graphile-worker for Python.

Each carries the process exit code the CLI uses for it, so the command line
and the library report the same failure the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConfigurationError",
    "DatabaseConnectionError",
    "GraphileWorkerError",
    "IncompatibleSchemaError",
    "JobCancelled",
    "JobLost",
    "JobSpecError",
    "JobTimeout",
    "LimitsBusyError",
    "MigrationError",
    "PayloadError",
    "SchemaNotInstalledError",
    "TaskLoadError",
    "UnreadableJobError",
    "UnsupportedPostgresError",
    "rebuilt",
]


class GraphileWorkerError(Exception):
    """Base class of this package's errors; ``exit_code`` is the CLI's code.
    Pickled as they are (see :func:`rebuilt`)."""

    exit_code: int = 1

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuilt, (type(self), self.args, self.__dict__)


def rebuilt(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An exception unpickled as it was, its ``__init__`` not called again: a
    class whose ``__init__`` takes other arguments than its ``args`` (``Snooze(60)``
    says ``snoozed for 60s``) comes back from a worker process as it was raised."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigurationError(GraphileWorkerError):
    """The worker cannot start with the settings it was given."""


class TaskLoadError(ConfigurationError):
    """A task file cannot be loaded; the message names the file and the reason."""


class MigrationError(GraphileWorkerError):
    """The schema cannot be installed or upgraded."""


class UnsupportedPostgresError(MigrationError):
    """The PostgreSQL server is older than version 12."""


class IncompatibleSchemaError(MigrationError):
    """The database holds a breaking schema revision this worker does not know."""

    exit_code = 57


class SchemaNotInstalledError(GraphileWorkerError):
    """The graphile-worker schema is missing from the database."""


class LimitsBusyError(GraphileWorkerError):
    """``set_limit`` waited 5 seconds for the limits, which something kept in
    use (a transaction left open after reading them); nothing was changed."""


class JobSpecError(ValueError):
    """A job's options are invalid; ``field`` names the offending option.

    Raised before the call commits anything (a large ``add_jobs`` rolls back
    the chunks it has already sent), so a bad call never leaves a half-added
    job or batch behind.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class DatabaseConnectionError(ConfigurationError):
    """The database refused or could not be reached; the message is libpq's."""


class PayloadError(ValueError):
    """A job's payload does not fit the type its task declares.

    ``field`` is the path to the part that does not fit (``payload.items[2].qty``)
    and ``reason`` what is wrong with it (``missing``, ``expected int, got str``).
    The task is never called, and the job fails permanently: the same payload
    cannot fit on a retry. A task may raise it too, to fail a job for good.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnreadableJobError(PayloadError):
    """A fetched job's row holds a value Python cannot read (a payload nested
    too deeply, an integer of too many digits). ``field`` names the column.
    Its task is never called, and it fails permanently at once: no retry can
    read it either (``reschedule_jobs`` revives it once the row is fixed)."""


class JobCancelled(GraphileWorkerError):
    """The job was cancelled while it ran (``cancel_job``): raised by
    ``helpers.raise_if_cancelled()``, and the error an ``async def`` task's
    cancellation is recorded with. A job with a cancel request that raises
    anything is recorded as cancelled, never retried; one whose task returns
    normally succeeded (its work is done)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(f"cancelled: {reason}" if reason else "cancelled")
        self.reason = reason


class JobTimeout(GraphileWorkerError):
    """An attempt ran longer than its job's timeout (``add_job(..., timeout=...)``,
    or its task's ``@task_options(timeout=...)``): the error the attempt is
    recorded with (``JobTimeout: exceeded 30s``) when its task raised after
    the timeout (an ``async def`` task is cancelled there). What it raised
    is the ``__cause__``. ``helpers.raise_if_cancelled()`` raises it too."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"exceeded {timeout:g}s")
        #: The timeout, in seconds.
        self.timeout = timeout


class JobLost(GraphileWorkerError):
    """An attempt that ended without an outcome: its worker was killed or lost
    before writing one, or the job was removed from the queue (or failed for
    good by an administrator) before it ran again. Where a result is kept per
    attempt (a Django ``TaskResult``), it is that attempt's error."""


class ProcessDied(RuntimeError):
    """The worker process running a ``@task_options(process=True)`` task's job
    ended before the job did (its exit code or signal in the message): the
    attempt fails with it, alone. A retry policy can tell it apart (a task that
    crashes its process every time may not be worth retrying)."""


class HelperUnavailable(AttributeError):
    """A helper that a task run in a worker process (``process=True``) does
    not have; the message names it and the ones it has."""

    def __init__(self, name: str, available: tuple[str, ...]) -> None:
        super().__init__(
            f"helpers.{name} is not available to a task run in a worker process "
            f"(process=True): it has helpers.{', helpers.'.join(available)}; run the task "
            "in a thread (no process=True) to use the others"
        )
        #: The helper asked for, and the ones such a task has.
        self.helper, self.available = name, available

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in the worker process, pickled back to the worker.
        return rebuilt, (type(self), self.args, self.__dict__)
