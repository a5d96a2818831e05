"""The SQL of the Django backend and its worker (``worker_cli.contrib.django``).
They are rendered to text for Django's cursor (``%s`` parameters, psycopg 3
or psycopg2 alike) by :func:`worker_cli.sql.render`. Every statement
returning a result row gives the same columns first, in the same order
(:func:`worker_cli.contrib.django.task_results.StoredResult.from_row`): the JSON
ones are read as text (Django's psycopg 3 connections return jsonb
undecoded, and their key order is kept)."""

from __future__ import annotations

#: Add the job and its result row in one statement (in the caller's
#: transaction); returns when it was enqueued. Parameters: identifier,
#: payload, run_at, max_attempts, job priority; id, backend, queue name,
#: task path, Django priority, run_after, args, kwargs.
ENQUEUE = """
insert into {schema}._private_py_django_results as r (
  id, job_id, backend, queue_name, task_path, priority, run_after, args, kwargs
)
select %s::uuid, j.id, %s, %s, %s, %s, %s, %s::json, %s::json
from {schema}.add_job(
  %s, %s::json, run_at => %s, max_attempts => %s, priority => %s
) as j
returning r.enqueued_at"""

#: A result row with the state of its job (``py_job_status``: 'running',
#: 'failed', 'cancelled', 'unknown', ...), the job's last error, for a
#: cancelled job its reason, when it finished, and whether a FAILED result's
#: task will run again (its job was given attempts again: ``MARK_RUNNING``).
#: Parameter: the result id.
READ_RESULT = """
select
  r.id::text, r.job_id, r.backend, r.queue_name, r.task_path, r.priority, r.run_after,
  r.args::text, r.kwargs::text, r.status, r.enqueued_at, r.started_at, r.last_attempted_at,
  r.finished_at, r.return_value::text, r.errors::text, r.worker_ids,
  s.state, s.last_error, s.cancel_reason, s.finished_at,
  r.status = 'FAILED' and s.state in ('waiting', 'scheduled', 'retrying', 'paused')
    and (r.job_attempts_left is null
      or s.max_attempts - s.attempts - 1 >= r.job_attempts_left) as runs_again
from {schema}._private_py_django_results as r
left join lateral {schema}.py_job_status(r.job_id) as s on true
where r.id = %s::uuid
"""

#: An attempt starts: RUNNING, this pool appended to worker_ids, the job's
#: attempts left kept; an attempt still marked RUNNING (its worker was lost)
#: is recorded as a failed one. A FAILED result starts again if its job has
#: as many attempts left as when its last attempt started, or more (it was
#: retried: given attempts again); its errors are kept. Parameters: the lost
#: attempt's error (a JSON list), the errors kept, the worker id, the job's
#: attempts left (max_attempts - attempts, this attempt counted), the result id.
MARK_RUNNING = """
update {schema}._private_py_django_results as r
set status = 'RUNNING',
  errors = case when r.status = 'RUNNING' then (
    select jsonb_agg(e.value order by e.n)
    from jsonb_array_elements(r.errors || u.error) with ordinality as e (value, n)
    where e.n = 1
      or e.n > jsonb_array_length(r.errors) + jsonb_array_length(u.error) - (u.keep - 1)
  ) else r.errors end,
  started_at = coalesce(r.started_at, now()),
  last_attempted_at = now(),
  finished_at = null,
  return_value = null,
  worker_ids = r.worker_ids || u.worker_id,
  job_attempts_left = u.attempts_left
from (
  select %s::jsonb as error, %s::int as keep, %s::text as worker_id, %s::int as attempts_left
) as u
where r.id = %s::uuid
  and (
    r.status in ('READY', 'RUNNING')
    or r.status = 'FAILED'
      and (r.job_attempts_left is null or u.attempts_left >= r.job_attempts_left)
  )
returning
  r.id::text, r.job_id, r.backend, r.queue_name, r.task_path, r.priority, r.run_after,
  r.args::text, r.kwargs::text, r.status, r.enqueued_at, r.started_at, r.last_attempted_at,
  r.finished_at, r.return_value::text, r.errors::text, r.worker_ids"""

#: A result row's status. Parameter: the result id.
READ_STATUS = """
select r.status from {schema}._private_py_django_results as r where r.id = %s::uuid"""

#: An attempt succeeded. Parameters: the return value (JSON), the result id.
MARK_SUCCESSFUL = """
update {schema}._private_py_django_results as r
set status = 'SUCCESSFUL', return_value = %s::json, finished_at = now()
where r.id = %s::uuid
returning r.finished_at"""

#: An attempt failed: READY when the job will run again, else FAILED; its
#: error appended (at most ``keep`` kept: the first and the latest).
#: Parameters: the status, the error (a JSON list), the errors kept, the result id.
MARK_FAILED = """
update {schema}._private_py_django_results as r
set status = u.status, errors = (
    select jsonb_agg(e.value order by e.n)
    from jsonb_array_elements(r.errors || u.error) with ordinality as e (value, n)
    where e.n = 1
      or e.n > jsonb_array_length(r.errors) + jsonb_array_length(u.error) - (u.keep - 1)
  ),
  finished_at = case when u.status = 'FAILED' then now() end
from (select %s::text as status, %s::jsonb as error, %s::int as keep) as u
where r.id = %s::uuid
returning r.finished_at"""

#: Delete finished results older than a number of seconds, at most 1,000 rows.
PRUNE = """
delete from {schema}._private_py_django_results as r
where r.id in (
  select x.id from {schema}._private_py_django_results as x
  where x.finished_at < now() - make_interval(secs => %s)
  limit 1000
)"""

#: Whether the results table exists (the schema is installed and migrated).
#: Parameter: the schema name.
RESULTS_TABLE_EXISTS = """
select to_regclass(quote_ident(%s) || '._private_py_django_results') is not null"""
