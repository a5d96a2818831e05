"""The migrator's bookkeeping (:mod:`worker_cli.schema.migrate`; the scripts
themselves are files under ``migrations/``)."""

from __future__ import annotations

# Serialises the Python migrators of one schema, until the transaction ends.
MIGRATION_LOCK = """
  select pg_advisory_xact_lock(%(namespace)s, hashtext(%(schema)s::text))
"""

# The latest revision and the latest breaking one (fails on a table older than
# graphile-worker 0.11, which has no "breaking" column).
MIGRATION_STATE = """
  select max(id), max(id) filter (where breaking) from {schema}.migrations
"""

MIGRATIONS_RECORDED = "select exists (select 1 from {schema}.migrations)"

# Revisions 1-16 at once (base.sql), with Node's breaking flags.
RECORD_BASE_MIGRATIONS = """
  insert into {schema}.migrations (id, breaking)
  select n, n = any(%(breaking)s::int[]) from unnest(%(ids)s::int[]) as n
"""

MIGRATION_RECORDED = "select exists (select 1 from {schema}.migrations where id = %(id)s)"

RECORD_MIGRATION = """
  insert into {schema}.migrations (id, breaking) values (%(id)s, %(breaking)s)
"""

PY_MIGRATIONS_RECORDED = "select id from {schema}._private_py_migrations"

PY_MIGRATION_RECORDED = """
  select exists (select 1 from {schema}._private_py_migrations where id = %(id)s)
"""

RECORD_PY_MIGRATION = "insert into {schema}._private_py_migrations (id) values (%(id)s)"

# Tells listening workers (Node's too) that a revision was applied.
NOTIFY_MIGRATED = "select pg_notify('worker:migrate', %(payload)s)"
