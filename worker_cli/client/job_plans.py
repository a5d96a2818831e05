"""Plans for the statements that add, change or return jobs, and the decoding of their rows.

The job functions return ``_private_jobs`` rows; the ``job_names`` statement then looks
up their task identifiers and queue names (a task or queue the function
created is invisible to the statement that called it), and
:func:`~worker_cli.jobs.job.decode_jobs` builds the jobs.

These are plans (:mod:`worker_cli.db.plan`): they say what to send and what the
rows mean, and the sync and async drivers send them, so both WorkerUtils
facades send exactly these statements. Errors meaning the schema is missing
become :class:`~worker_cli.errors.SchemaNotInstalledError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, LiteralString

from psycopg import errors as pg_errors

from ..db.plan import Plan, Row, Sent, execute, fetch, query, send, transaction
from ..errors import JobSpecError
from ..jobs.job import Job, decode_jobs, task_and_queue_ids
from ..jobs.job_spec import JobSpec, encode_payload
from ..jobs.payloads import json_default
from ..jobs.unique import JOB_COLUMNS_FROM, UniqueJobResult, UniqueRuleError, results_from_rows
from ..schema.probe import schema_required
from ..sql import compose
from ..sql import jobs as jobs_sql
from .job_options import OptionRows, spec_options
from .trace_context import carry

__all__ = [
    "encode_specs",
    "execute_statement",
    "insert_jobs",
    "jobs",
    "spec_record",
    "unique_results",
]

#: Specs per statement when add_jobs pipelines a large batch (see
#: insert_jobs); measured with tests/benchmark.py --extras.
ADD_JOBS_CHUNK = 5000


def execute_statement(
    schema: str, statement: LiteralString, params: Mapping[str, Any]
) -> Plan[None]:
    """Run one statement that returns nothing we read."""
    with schema_required(schema):
        yield from execute(compose(statement, schema), params)


def jobs(schema: str, statement: LiteralString, params: Mapping[str, Any]) -> Plan[list[Job]]:
    """The jobs returned by one statement (its rows: JOB_COLUMNS)."""
    with schema_required(schema):
        rows = yield from query(compose(statement, schema), params, raw_payloads=True)
        return (yield from _jobs(schema, rows))


def unique_results(
    schema: str, statement: LiteralString, params: Mapping[str, Any]
) -> Plan[list[UniqueJobResult]]:
    """The results of ``add_unique_job(s)``, in the order of their rows."""
    with schema_required(schema):
        try:
            rows = yield from query(compose(statement, schema), params, raw_payloads=True)
            if not rows:
                return []
            tasks, queues = yield from _names(schema, rows, first=JOB_COLUMNS_FROM)
        except pg_errors.InvalidParameterValue as exc:
            # The SQL function's own check of a rule (Python checks first).
            field, _, reason = (exc.diag.message_primary or "").partition(": ")
            raise UniqueRuleError(field, reason) from exc
    return results_from_rows(rows, tasks, queues)


def insert_jobs(
    schema: str,
    specs: Sequence[JobSpec | Mapping[str, Any]],
    job_key_preserve_run_at: bool,
    options_installed: Callable[[], Plan[bool]],
) -> Plan[list[Job]]:
    """``add_jobs``: one statement per chunk of specs, in one transaction.

    The first chunk is checked before anything is sent, so a bad spec in a
    batch of one chunk (the usual case) costs no round trip. A large batch
    goes out in a pipeline: the database inserts one chunk while the next is
    checked and encoded. A bad spec in a later chunk rolls back the earlier
    ones, so the call stays all-or-nothing. ``options_installed`` tells
    whether the schema has the jobs' options table (see :mod:`.job_options`).
    """
    keys: dict[str, int] = {}
    first = _chunk_params(specs, 0, keys, job_key_preserve_run_at)
    with schema_required(schema):
        return (
            yield from transaction(
                _insert_chunks(
                    schema, specs, first, keys, job_key_preserve_run_at, options_installed
                ),
                pipeline=len(specs) > ADD_JOBS_CHUNK,
            )
        )


def _insert_chunks(
    schema: str,
    specs: Sequence[JobSpec | Mapping[str, Any]],
    first: dict[str, Any],
    keys: dict[str, int],
    job_key_preserve_run_at: bool,
    options_installed: Callable[[], Plan[bool]],
) -> Plan[list[Job]]:
    sent = [(yield from _send_chunk(schema, first, options_installed))]
    for start in range(ADD_JOBS_CHUNK, len(specs), ADD_JOBS_CHUNK):
        params = _chunk_params(specs, start, keys, job_key_preserve_run_at)
        sent.append((yield from _send_chunk(schema, params, options_installed)))
    rows: list[Row] = []
    for each in sent:
        rows.extend((yield from fetch(each)))
    return (yield from _jobs(schema, rows))


def _send_chunk(
    schema: str, params: dict[str, Any], options_installed: Callable[[], Plan[bool]]
) -> Plan[Sent]:
    """Send one chunk's statement, with the caller's trace context and the
    specs' options (``options``: what to write, see :mod:`.job_options`)."""
    options: OptionRows | None = params.pop("options")
    replaces: bool = params.pop("replaces")
    if options == "replaced" and not (yield from options_installed()):
        options = None  # no job can have options: nothing to clear
    add_jobs, trace = carry(jobs_sql.ADD_JOBS, options=options, replaces=replaces)
    statement = compose(add_jobs, schema)
    return (yield from send(statement, {**params, **trace}, raw_payloads=True))


def _chunk_params(
    specs: Sequence[JobSpec | Mapping[str, Any]],
    start: int,
    keys: dict[str, int],
    job_key_preserve_run_at: bool,
) -> dict[str, Any]:
    """The parameters of ``add_jobs`` for the chunk of specs from ``start``, checked."""
    records = [
        spec_record(raw, index, keys)
        for index, raw in enumerate(specs[start : start + ADD_JOBS_CHUNK], start)
    ]
    return {
        "specs": encode_specs(records, start),
        "job_key_preserve_run_at": job_key_preserve_run_at,
        "options": spec_options(records),
        "replaces": any(record.get("job_key") is not None for record in records),
    }


def _jobs(schema: str, rows: Sequence[Row]) -> Plan[list[Job]]:
    """Jobs from rows of JOB_COLUMNS read with raw payloads."""
    if not rows:
        return []
    tasks, queues = yield from _names(schema, rows)
    return decode_jobs(rows, tasks, queues)


def _names(
    schema: str, rows: Sequence[Row], *, first: int = 0
) -> Plan[tuple[dict[int, str], dict[int, str]]]:
    """The task identifiers and queue names of job rows (see
    :func:`~worker_cli.jobs.job.task_and_queue_ids`), by id."""
    task_ids, queue_ids = task_and_queue_ids(rows, first=first)
    names = yield from query(
        compose(jobs_sql.JOB_NAMES, schema),
        {"task_ids": task_ids, "queue_ids": queue_ids},
    )
    tasks: dict[int, str] = {}
    queues: dict[int, str] = {}
    for kind, id_, name in names:
        (tasks if kind == "task" else queues)[id_] = name
    return tasks, queues


def spec_record(
    raw: JobSpec | Mapping[str, Any], index: int, keys: dict[str, int] | None = None
) -> dict[str, Any]:
    """Spec number ``index`` of add_jobs, checked, as a ``job_spec`` JSON record.

    ``keys`` maps the job keys of the earlier specs to their index, to refuse
    a key given twice (add_jobs would otherwise fail on it in PostgreSQL).
    """
    spec = JobSpec.coerce(raw, index)
    try:
        spec.validate()
    except JobSpecError as exc:
        raise JobSpecError(f"specs[{index}].{exc.field}", exc.reason) from None
    if keys is not None and spec.job_key is not None:
        first = keys.setdefault(spec.job_key, index)
        if first != index:
            raise JobSpecError(f"specs[{index}].job_key", f"is also the job_key of specs[{first}]")
    return spec.to_json_record()


def encode_specs(records: Sequence[dict[str, Any]], offset: int = 0) -> str:
    """Spec records as one JSON array; a payload that cannot be encoded is named
    by its index (``offset``: the index of ``records[0]`` in the call)."""
    try:
        return json.dumps(records, default=json_default, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        for index, record in enumerate(records, offset):
            encode_payload(record["payload"], field=f"specs[{index}].payload")
        raise
