"""What each WorkerUtils method does, once, for the async and the sync facade.

:class:`UtilsPlans` has one method per method of
:class:`~worker_cli.client.worker_utils.WorkerUtils` and
:class:`~worker_cli.client.sync_worker_utils.SyncWorkerUtils`, with the same
arguments. Each checks its arguments at once (a bad call raises before any
I/O), builds the statement's parameters, and returns a plan
(:mod:`worker_cli.db.plan`) that the facade runs with its driver. So validation,
payload encoding (:func:`~worker_cli.jobs.job_spec.encode_payload`), SQL and
decoding exist once; the facades only choose a connection and wait.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from ..db.plan import Plan, query
from ..errors import JobSpecError, LimitsBusyError
from ..jobs.job import Job
from ..jobs.job_spec import (
    JobSpec,
    TaskSpec,
    check_timeout,
    encode_payload,
    local_run_at,
    validate_identifier,
    with_local_run_at,
)
from ..jobs.job_state import AttemptError, JobLog, JobResult, check_job_id
from ..jobs.limit_spec import Limit, LimitInfo, limit_params, limit_target
from ..jobs.pause_spec import Pause, pause_params, target
from ..jobs.payloads import NamedPayload, job_identity
from ..jobs.text_args import check_text
from ..jobs.unique import (
    UniqueJobResult,
    UniqueRule,
    UniqueSpec,
    check_keys_payload,
    rules_for_specs,
)
from ..schema.cleanup_tasks import (
    CLEANUP_STATEMENTS,
    CleanupTask,
    check_cleanup_tasks,
    delete_unique_locks,
)
from ..schema.migrate import MigrationReport, migration_plan
from ..schema.probe import schema_required, unique_installed
from ..sql import cancel as cancel_sql
from ..sql import cleanup as cleanup_sql
from ..sql import compose
from ..sql import history as history_sql
from ..sql import job_logs as job_logs_sql
from ..sql import jobs as jobs_sql
from ..sql import limits as limits_sql
from ..sql import pauses as pauses_sql
from ..sql import waiting as waiting_sql
from .job_options import OptionRows, OptionsTable, job_options, spec_options
from .job_plans import encode_specs, execute_statement, insert_jobs, jobs, spec_record
from .job_plans import unique_results as unique_results_plan
from .trace_context import carry

__all__ = ["UtilsPlans", "add_job_params"]


def add_job_params(
    identifier: str, payload: Any, options: TaskSpec, use_local_time: bool = False
) -> dict[str, Any]:
    """The checked parameters of ``add_job`` (jobs_sql.ADD_JOB): the one place
    they are built, for every way of adding one job. With ``use_local_time`` a
    missing ``run_at`` is this process's time (see :func:`local_run_at`)."""
    validate_identifier(identifier)
    options.validate()
    params: dict[str, Any] = {
        "identifier": identifier,
        "payload": encode_payload(payload),
        "queue_name": options.queue_name,
        "run_at": local_run_at(options.run_at, use_local_time),
        "max_attempts": options.max_attempts,
        "job_key": options.job_key,
        "priority": options.priority,
        "flags": list(options.flags) if options.flags is not None else None,
        "job_key_mode": options.job_key_mode or "replace",
    }
    if options.timeout is not None:  # written beside the job (job_options)
        params["timeout"] = check_timeout(options.timeout)
    return params


class UtilsPlans:
    """The plans of the WorkerUtils methods for one schema.

    It also remembers whether the schema has the unique-jobs table (checked
    once, on the connection of the first call that needs to know). Shared by
    the threads of a SyncWorkerUtils: the worst a race does is check twice.
    """

    def __init__(self, schema: str, *, use_local_time: bool = False) -> None:
        self.schema = schema
        #: A job added without ``run_at`` gets this process's time (UTC), not
        #: the database's now() (graphile-worker's ``useNodeTime``).
        self.use_local_time = use_local_time
        # Whether the unique-jobs table exists (None: not checked yet).
        self._unique_tables: bool | None = None
        self._on_call: bool | None = None
        self._options = OptionsTable(schema)

    def add_job(
        self,
        identifier: str | NamedPayload,
        payload: Any,
        options: TaskSpec,
        unique: UniqueSpec | None,
    ) -> Plan[Job | UniqueJobResult]:
        """``add_job``, its keyword arguments but ``unique`` gathered in ``options``
        (``identifier`` may be the payload, whose class names its task)."""
        identifier, payload = job_identity(identifier, payload)
        params = add_job_params(identifier, payload, options, self.use_local_time)
        # The job's options, if any, beside it (see job_options).
        beside = job_options("timeout" in params, params["job_key"], params["job_key_mode"])
        if unique is not None:
            rule = UniqueRule.coerce(unique).to_json()
            check_keys_payload(rule, payload)
            params["unique_rule"] = json.dumps(rule)
        return self._add_job(params, beside, unique is not None)

    def _add_job(
        self, params: dict[str, Any], beside: OptionRows | None, unique: bool
    ) -> Plan[Job | UniqueJobResult]:
        beside = yield from self._options.writes(beside)
        # The caller's trace context, if any, beside it too (a job it replaces
        # through its key takes this call's, or none).
        replaces = params["job_key"] is not None and params["job_key_mode"] != "unsafe_dedupe"
        if not unique:
            statement, trace = carry(jobs_sql.ADD_JOB, options=beside, replaces=replaces)
            [job] = yield from jobs(self.schema, statement, {**params, **trace})
            return job
        statement, trace = carry(
            jobs_sql.ADD_UNIQUE_JOB, unique=True, options=beside, replaces=replaces
        )
        [result] = yield from unique_results_plan(self.schema, statement, {**params, **trace})
        return result

    def add_jobs(
        self,
        specs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        job_key_preserve_run_at: bool,
        unique: UniqueSpec | Sequence[UniqueSpec | None] | None,
    ) -> Plan[list[Job] | list[UniqueJobResult]]:
        """``add_jobs``."""
        if self.use_local_time:
            specs = with_local_run_at(specs)
        if unique is None:
            if not specs:
                return _nothing([])
            return insert_jobs(self.schema, specs, job_key_preserve_run_at, self._options.installed)
        records = [spec_record(raw, index) for index, raw in enumerate(specs)]
        rules = rules_for_specs(unique, [record["payload"] for record in records])
        if not records:
            return _nothing([])
        params = {
            "specs": encode_specs(records),
            "unique_rules": json.dumps(rules),
            "job_key_preserve_run_at": job_key_preserve_run_at,
        }
        replaces = any(record.get("job_key") is not None for record in records)
        return self._add_unique_jobs(params, spec_options(records), replaces)

    def _add_unique_jobs(
        self, params: dict[str, Any], beside: OptionRows | None, replaces: bool
    ) -> Plan[list[UniqueJobResult]]:
        beside = yield from self._options.writes(beside)
        statement, trace = carry(
            jobs_sql.ADD_UNIQUE_JOBS,
            unique=True,
            order_by="spec_index",
            options=beside,
            replaces=replaces,
        )
        return (yield from unique_results_plan(self.schema, statement, {**params, **trace}))

    def remove_job(self, job_key: str) -> Plan[Job | None]:
        """``remove_job``."""
        if not isinstance(job_key, str) or not job_key:
            raise JobSpecError("job_key", "must be a non-empty string")
        return self._remove_job(job_key)

    def _remove_job(self, job_key: str) -> Plan[Job | None]:
        # A job an administrator removed no longer blocks its duplicates, and
        # is recorded as removed where the schema can (Python migration 23).
        if (yield from self._on_call_installed()):
            statement = jobs_sql.REMOVE_JOB_RECORDED
        elif (yield from self._unique_installed()):
            statement = jobs_sql.REMOVE_JOB_RELEASING_UNIQUE_LOCK
        else:
            statement = jobs_sql.REMOVE_JOB
        found = yield from jobs(self.schema, statement, {"job_key": job_key, "by": "api"})
        return found[0] if found else None

    def complete_jobs(self, job_ids: Sequence[int]) -> Plan[list[Job]]:
        """``complete_jobs``."""
        return jobs(self.schema, jobs_sql.COMPLETE_JOBS, {"job_ids": list(job_ids)})

    def permanently_fail_jobs(self, job_ids: Sequence[int], reason: str | None) -> Plan[list[Job]]:
        """``permanently_fail_jobs``."""
        params = {"job_ids": list(job_ids), "error_message": reason}
        return jobs(self.schema, jobs_sql.PERMANENTLY_FAIL_JOBS, params)

    def reschedule_jobs(
        self,
        job_ids: Sequence[int],
        *,
        run_at: datetime | None,
        priority: int | None,
        attempts: int | None,
        max_attempts: int | None,
    ) -> Plan[list[Job]]:
        """``reschedule_jobs``."""
        TaskSpec(run_at=run_at, priority=priority, max_attempts=max_attempts).validate()
        if attempts is not None and (isinstance(attempts, bool) or not 0 <= attempts <= 32767):
            raise JobSpecError("attempts", f"is {attempts}; it must be between 0 and 32767")
        params = {
            "job_ids": list(job_ids),
            "run_at": run_at,
            "priority": priority,
            "attempts": attempts,
            "max_attempts": max_attempts,
        }
        return jobs(self.schema, jobs_sql.RESCHEDULE_JOBS, params)

    def job_result(self, job_id: int) -> Plan[JobResult]:
        """``get_job_result`` and ``get_job_status``: the record of one job."""
        check_job_id(job_id)
        return self._job_result(job_id)

    def _job_result(self, job_id: int) -> Plan[JobResult]:
        with schema_required(self.schema):
            statement = compose(jobs_sql.JOB_STATUS, self.schema)
            rows = yield from query(statement, {"job_id": job_id}, lenient_times=True)
        return JobResult.from_row(rows[0])

    def job_errors(self, job_id: int) -> Plan[list[AttemptError]]:
        """``get_job_errors``: a job's attempt errors, oldest first."""
        check_job_id(job_id)
        return self._job_errors(job_id)

    def _job_errors(self, job_id: int) -> Plan[list[AttemptError]]:
        with schema_required(self.schema):
            statement = compose(jobs_sql.JOB_ERRORS, self.schema)
            rows = yield from query(statement, {"job_id": job_id})
        return [AttemptError(*row) for row in rows]

    def job_logs(self, job_id: int) -> Plan[list[JobLog]]:
        """``get_job_logs``: a job's kept attempt logs, oldest first."""
        check_job_id(job_id)
        return self._job_logs(job_id)

    def _job_logs(self, job_id: int) -> Plan[list[JobLog]]:
        with schema_required(self.schema):
            statement = compose(job_logs_sql.JOB_LOGS, self.schema)
            rows = yield from query(statement, {"job_id": job_id})
        return [JobLog.from_row(row) for row in rows]

    def cancel_jobs(self, job_ids: Sequence[int], reason: str | None) -> Plan[dict[int, Any]]:
        """``cancel_job`` and ``cancel_jobs``: each job's state after the call."""
        for job_id in job_ids:
            check_job_id(job_id)
        check_text(reason, "reason")
        return self._cancel_jobs(list(job_ids), reason)

    def _cancel_jobs(self, job_ids: list[int], reason: str | None) -> Plan[dict[int, Any]]:
        with schema_required(self.schema):
            statement = compose(cancel_sql.CANCEL_JOBS, self.schema)
            rows = yield from query(statement, {"job_ids": job_ids, "reason": reason})
        states = {int(job_id): state for job_id, state in rows}
        return {job_id: states[job_id] for job_id in job_ids}

    def wait_step(self, job_id: int, *, register: bool) -> Plan[tuple[bool, JobResult]]:
        """One read of ``wait_for_job`` (in autocommit mode: the registration
        is committed before the state is read): with ``register``, first
        mark the job as waited for (``notify_on_finish``), if it is visible.
        Returns whether it is registered, and its record."""
        registered = True
        if register:
            with schema_required(self.schema):
                statement = compose(waiting_sql.REGISTER_WAITER, self.schema)
                rows = yield from query(statement, {"job_id": job_id})
            registered = bool(rows[0][0])
        return registered, (yield from self._job_result(job_id))

    def pause(
        self,
        queue: str | None,
        task: str | None,
        until: datetime | timedelta | float | None,
        reason: str | None,
        hold_queue_lock: bool,
    ) -> Plan[Pause]:
        """``pause``: the pause as stored."""
        return self._pause(pause_params(queue, task, until, reason, hold_queue_lock))

    def _pause(self, params: dict[str, Any]) -> Plan[Pause]:
        with schema_required(self.schema):
            statement = compose(pauses_sql.PAUSE, self.schema)
            rows = yield from query(statement, params)
        return Pause.from_row(rows[0])

    def resume(self, queue: str | None, task: str | None) -> Plan[bool]:
        """``resume``: whether it was paused."""
        kind, name = target(queue, task)
        return self._resume(kind, name)

    def _resume(self, kind: str, name: str) -> Plan[bool]:
        with schema_required(self.schema):
            statement = compose(pauses_sql.RESUME, self.schema)
            rows = yield from query(statement, {"kind": kind, "name": name})
        return bool(rows[0][0])

    def list_pauses(self) -> Plan[list[Pause]]:
        """``list_pauses``: the pauses in force."""
        with schema_required(self.schema):
            statement = compose(pauses_sql.LIST_PAUSES, self.schema)
            rows = yield from query(statement, {})
        return [Pause.from_row(row) for row in rows]

    def set_limit(
        self, limit: Limit, queue: str | None, task: str | None, operation: str | None
    ) -> Plan[LimitInfo]:
        """``set_limit``: the limit as stored, and its use."""
        return self._set_limit(limit_params(limit, queue, task, operation))

    def _set_limit(self, params: dict[str, Any]) -> Plan[LimitInfo]:
        with schema_required(self.schema):
            statement = compose(limits_sql.SET_LIMIT, self.schema)
            try:
                rows = yield from query(statement, params)
            except psycopg.errors.LockNotAvailable as exc:  # py_set_limit's 5 s wait
                raise LimitsBusyError(exc.diag.message_primary or str(exc)) from None
        return LimitInfo.from_row(rows[0])

    def remove_limit(
        self, queue: str | None, task: str | None, operation: str | None
    ) -> Plan[bool]:
        """``remove_limit``: whether there was one."""
        kind, name = limit_target(queue, task, operation)
        return self._remove_limit(kind, name)

    def _remove_limit(self, kind: str, name: str) -> Plan[bool]:
        with schema_required(self.schema):
            statement = compose(limits_sql.REMOVE_LIMIT, self.schema)
            rows = yield from query(statement, {"kind": kind, "name": name})
        return bool(rows[0][0])

    def list_limits(self) -> Plan[list[LimitInfo]]:
        """``list_limits``: every limit and its use."""
        with schema_required(self.schema):
            statement = compose(limits_sql.LIST_LIMITS, self.schema)
            rows = yield from query(statement, {})
        return [LimitInfo.from_row(row) for row in rows]

    def force_unlock_workers(self, worker_ids: Sequence[str]) -> Plan[None]:
        """``force_unlock_workers``."""
        params = {"worker_ids": list(worker_ids)}
        return execute_statement(self.schema, jobs_sql.FORCE_UNLOCK_WORKERS, params)

    def cleanup(
        self, tasks: Sequence[CleanupTask], *, task_identifiers_to_keep: Sequence[str]
    ) -> Plan[None]:
        """``cleanup``: each task's statement, in :data:`CLEANUP_STATEMENTS`' order
        (the facades run it in autocommit mode on their own connections)."""
        check_cleanup_tasks(tasks)
        return self._cleanup(tasks, list(task_identifiers_to_keep))

    def _cleanup(self, tasks: Sequence[CleanupTask], keep: list[str]) -> Plan[None]:
        for name, statement in CLEANUP_STATEMENTS.items():
            if name not in tasks:
                continue
            if name == "GC_UNIQUE_LOCKS":
                yield from self.gc_unique_locks()
                continue
            if name == "DELETE_PERMAFAILED_JOBS" and (yield from self._unique_installed()):
                # A deleted job would otherwise look like a success to its lock;
                # with the lifecycle installed, it is archived in the history.
                statement = cleanup_sql.DELETE_PERMAFAILED_JOBS_RELEASING_UNIQUE_LOCKS
                rows = yield from query(
                    compose(history_sql.LIFECYCLE_INSTALLED, self.schema),
                    {"schema": self.schema},
                )
                if rows and rows[0][0]:
                    statement = cleanup_sql.ARCHIVE_PERMAFAILED_JOBS
            yield from execute_statement(self.schema, statement, {"keep": keep})

    def gc_unique_locks(self) -> Plan[int]:
        """``gc_unique_locks`` (the facades run it in autocommit mode on their own
        connections, so each batch is a transaction of its own)."""
        if not (yield from self._unique_installed()):
            return 0
        return (yield from delete_unique_locks(self.schema))

    def migrate(self) -> Plan[MigrationReport]:
        """``migrate`` (in autocommit mode on the facades' own connections)."""
        try:
            return (yield from migration_plan(self.schema))
        finally:
            self._unique_tables = None
            self._on_call = None

    def _on_call_installed(self) -> Plan[bool]:
        """Whether this schema records removals (Python migration 23; checked
        once)."""
        if self._on_call is None:
            statement = compose(jobs_sql.ON_CALL_INSTALLED, self.schema)
            rows = yield from query(statement, {"schema": self.schema})
            self._on_call = bool(rows and rows[0][0])
        return self._on_call

    def _unique_installed(self) -> Plan[bool]:
        """Whether this schema has the unique-jobs table (checked once)."""
        if self._unique_tables is None:
            self._unique_tables = yield from unique_installed(self.schema)
        return self._unique_tables


def _nothing(value: Any) -> Plan[Any]:
    """A plan that sends nothing and returns ``value``."""
    return value
    yield  # a generator
