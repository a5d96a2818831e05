"""graphile-worker for Python.

A PostgreSQL job queue that shares its schema and SQL API with graphile-worker (Node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .client.job_waiting import WaitTimeout
from .client.worker_utils import CleanupTask, WorkerUtils, make_worker_utils, quick_add_job
from .client.workflow_plans import WorkflowNotFound, WorkflowWaitTimeout
from .config.options import WorkerOptions
from .errors import (
    ConfigurationError,
    DatabaseConnectionError,
    GraphileWorkerError,
    HelperUnavailable,
    IncompatibleSchemaError,
    JobCancelled,
    JobSpecError,
    JobTimeout,
    LimitsBusyError,
    MigrationError,
    PayloadError,
    ProcessDied,
    SchemaNotInstalledError,
    UnsupportedPostgresError,
)
from .jobs.job import Job
from .jobs.job_spec import JobKeyMode, JobSpec, TaskSpec
from .jobs.job_state import (
    AttemptError,
    JobLog,
    JobProgress,
    JobResult,
    JobState,
    ResultUnavailable,
)
from .jobs.limit_spec import Limit, LimitInfo
from .jobs.pause_spec import Pause
from .jobs.payloads import NamedPayload
from .jobs.schedule import Schedule
from .jobs.unique import UniqueJobResult, UniqueRule, UniqueRuleError
from .jobs.workflow import Step, Workflow, WorkflowError, batch
from .jobs.workflow_state import AddedWorkflow, ParentOutcome, StepInfo, WorkflowInfo
from .observe.events import Events
from .runner import Runner, run, run_migrations, run_once
from .schema.migrate import LATEST_REVISION, MigrationReport
from .tasks.helpers import Helpers
from .tasks.loader import Task, TaskLoadError
from .tasks.retry_policy import Cancel, Discard, RetryPolicy, Snooze
from .tasks.task_options import TaskOptions, task_options
from .tasks.typed_tasks import TypedTaskFunction, typed_task_list

__all__ = [
    "LATEST_REVISION",
    "AddedWorkflow",
    "AttemptError",
    "Cancel",
    "CleanupTask",
    "ConfigurationError",
    "CronItem",
    "CrontabError",
    "DatabaseConnectionError",
    "Discard",
    "Events",
    "GraphileWorkerError",
    "HelperUnavailable",
    "Helpers",
    "IncompatibleSchemaError",
    "Job",
    "JobCancelled",
    "JobKeyMode",
    "JobLog",
    "JobProgress",
    "JobResult",
    "JobSpec",
    "JobSpecError",
    "JobState",
    "JobTimeout",
    "Limit",
    "LimitInfo",
    "LimitsBusyError",
    "MigrationError",
    "MigrationReport",
    "NamedPayload",
    "ParentOutcome",
    "ParsedCronItem",
    "Pause",
    "PayloadError",
    "ProcessDied",
    "ResultUnavailable",
    "RetryPolicy",
    "Runner",
    "Schedule",
    "SchemaNotInstalledError",
    "Snooze",
    "Step",
    "StepInfo",
    "SyncWorkerUtils",
    "Task",
    "TaskLoadError",
    "TaskOptions",
    "TaskSpec",
    "TypedTaskFunction",
    "UniqueJobResult",
    "UniqueRule",
    "UniqueRuleError",
    "UnsupportedPostgresError",
    "WaitTimeout",
    "WorkerOptions",
    "WorkerUtils",
    "Workflow",
    "WorkflowError",
    "WorkflowInfo",
    "WorkflowNotFound",
    "WorkflowWaitTimeout",
    "__version__",
    "batch",
    "load_config",
    "make_sync_worker_utils",
    "make_worker_utils",
    "parse_cron_items",
    "parse_crontab",
    "quick_add_job",
    "quick_add_job_sync",
    "run",
    "run_migrations",
    "run_once",
    "task_options",
    "typed_task_list",
]

if TYPE_CHECKING:
    from .cli.run_config import load_config
    from .client.sync_worker_utils import (
        SyncWorkerUtils,
        make_sync_worker_utils,
        quick_add_job_sync,
    )
    from .jobs.crontab import (
        CronItem,
        CrontabError,
        ParsedCronItem,
        parse_cron_items,
        parse_crontab,
    )

_LAZY = {"CronItem", "CrontabError", "ParsedCronItem", "parse_cron_items", "parse_crontab"}
_LAZY_SYNC = {"SyncWorkerUtils", "make_sync_worker_utils", "quick_add_job_sync"}


def __getattr__(name: str) -> Any:
    # The crontab parser is imported on first use: a worker without a crontab
    # starts faster.
    if name in _LAZY:
        from .jobs import crontab

        return getattr(crontab, name)
    if name in _LAZY_SYNC:  # the synchronous utilities: a worker does not use them
        from .client import sync_worker_utils

        return getattr(sync_worker_utils, name)
    if name == "load_config":  # the command line's options: imported when used
        from .cli.run_config import load_config

        return load_config
    raise AttributeError(f"module 'worker_cli' has no attribute {name!r}")
