"""Statements about a session or a transaction rather than the schema: the
savepoint the utilities use on a caller's connection, the reset of a
connection lent to a task, and the dashboard's read-only settings. None names
the schema, so none goes through :func:`~worker_cli.sql.compose`."""

from __future__ import annotations

from typing import LiteralString

# Transaction control on the caller's connection (psycopg's transaction()
# would commit a transaction it opened itself, so these are sent as they are).
SAVEPOINT: LiteralString = "savepoint graphile_worker"
RELEASE_SAVEPOINT: LiteralString = "release savepoint graphile_worker"
ROLLBACK_TO_SAVEPOINT: LiteralString = "rollback to savepoint graphile_worker"
# Around each attempt worker_cli.testing runs in a caller's transaction: a
# task whose own statement fails (the transaction in error) has that
# attempt's work undone, and fails alone.
ATTEMPT_SAVEPOINT: LiteralString = "savepoint graphile_worker_attempt"
RELEASE_ATTEMPT_SAVEPOINT: LiteralString = "release savepoint graphile_worker_attempt"
ROLLBACK_TO_ATTEMPT_SAVEPOINT: LiteralString = "rollback to savepoint graphile_worker_attempt"
# Any statement: on a caller's connection that is not in autocommit and has no
# transaction open, psycopg opens it first (worker_cli.testing joins it, and
# never commits it).
OPEN_TRANSACTION: LiteralString = "select 1"

#: What a borrower may have left on the server's session, undone in one
#: round trip (what ``DISCARD ALL`` does, but for the prepared statements and
#: cached plans, which are the package's as much as the borrower's: psycopg
#: prepares the worker's frequent statements). The session authorization
#: first: it also ends a ``SET ROLE``, and the statements after it run as the
#: connection's own user. Bytes: sent by libpq directly
#: (:mod:`worker_cli.db.held_connection`).
RESET_SESSION = (
    b"set session authorization default; reset all; close all; unlisten *; "
    b"select pg_catalog.pg_advisory_unlock_all(); discard temp; discard sequences"
)

# The dashboard's read-only mode: every transaction of the connection.
READ_ONLY_SESSION: LiteralString = "set default_transaction_read_only = on"
# Each page is read in one snapshot, read-only.
READ_ONLY_SNAPSHOT: LiteralString = "set transaction isolation level repeatable read, read only"
