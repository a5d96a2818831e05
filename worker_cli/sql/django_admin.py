"""What the Django admin's models (``worker_cli.contrib.django.models``) name
in SQL: the tables they read, as Django's ``db_table``, and the two functions
a job's state comes from, as the names of Django ``Func`` expressions. Django
writes the statements around them; :func:`worker_cli.sql.render` quotes the
schema in. A table's name is quoted whole (``"graphile_worker"."_private_jobs"``):
Django quotes a ``db_table`` unless it starts and ends with a double quote.

Every read the admin makes reaches these tables through their primary keys
(or ``_private_tasks``' and ``_private_job_queues``' unique names): the pages
of jobs and finished jobs are windows of the newest ids, their filters
applied inside a window of at most 10,000 rows, their counts capped (see
``worker_cli.contrib.django.admin``).
"""

from __future__ import annotations

from typing import LiteralString

#: graphile-worker's jobs (migrations/base.sql): Node's table, read only, its
#: writes through graphile-worker's functions (worker_cli.sql.admin).
JOBS_TABLE: LiteralString = '{schema}."_private_jobs"'
#: The task identifiers a job's ``task_id`` names (unique: tasks_identifier_key).
TASKS_TABLE: LiteralString = '{schema}."_private_tasks"'
#: The named queues a job's ``job_queue_id`` names (unique: job_queues_queue_name_key).
QUEUES_TABLE: LiteralString = '{schema}."_private_job_queues"'
#: The finished jobs' history (migrations/py/000007.sql, 000023.sql).
HISTORY_TABLE: LiteralString = '{schema}."_private_py_job_history"'
#: The schedules in the database (migrations/py/000027.sql).
SCHEDULES_TABLE: LiteralString = '{schema}."_private_py_schedules"'

#: py_job_state(locked_at, attempts, max_attempts, run_at, paused_by): a
#: live job's state word (migrations/py/functions.sql).
JOB_STATE: LiteralString = "{schema}.py_job_state"
#: py_paused_by(task_id, job_queue_id): the pause holding a job, as shown
#: (``queue mail``), or null.
PAUSED_BY: LiteralString = "{schema}.py_paused_by"
#: A ``timestamptz`` column read as a Python datetime can hold it: null
#: outside the two dates given (%s, %s: ``infinity``, year 12000), else the
#: value. ``{value}`` is the column's SQL as Django writes it, twice (its
#: parameters go in twice); see ``models.StoredTimestamp``.
READABLE_TIMESTAMP: LiteralString = (
    "(case when {value} between %s::timestamptz and %s::timestamptz then {value} end)"
)
