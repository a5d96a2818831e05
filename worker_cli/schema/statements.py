"""The names :mod:`worker_cli.schema.migrate` reads its statements by, until it
imports :mod:`worker_cli.sql.migrations` itself (its rewrite, issue 42). No
SQL here: every statement lives in :mod:`worker_cli.sql`."""

from __future__ import annotations

from ..sql import compose
from ..sql.migrations import MIGRATION_LOCK as migration_lock
from ..sql.migrations import MIGRATION_RECORDED as migration_recorded
from ..sql.migrations import MIGRATION_STATE as migration_state
from ..sql.migrations import MIGRATIONS_RECORDED as migrations_recorded
from ..sql.migrations import NOTIFY_MIGRATED as notify_migrated
from ..sql.migrations import PY_MIGRATION_RECORDED as py_migration_recorded
from ..sql.migrations import PY_MIGRATIONS_RECORDED as py_migrations_recorded
from ..sql.migrations import RECORD_BASE_MIGRATIONS as record_base_migrations
from ..sql.migrations import RECORD_MIGRATION as record_migration
from ..sql.migrations import RECORD_PY_MIGRATION as record_py_migration

__all__ = [
    "compose",
    "migration_lock",
    "migration_recorded",
    "migration_state",
    "migrations_recorded",
    "notify_migrated",
    "py_migration_recorded",
    "py_migrations_recorded",
    "record_base_migrations",
    "record_migration",
    "record_py_migration",
]
