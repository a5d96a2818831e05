"""Plans: the database work of WorkerUtils and the migrator, written once, with no I/O.

A plan is a generator. It yields one operation at a time (send this statement,
run this sub-plan in a transaction, ...) and is sent back the operation's
result (the rows), or has the operation's error raised at the ``yield``; what
it returns is the result of the whole plan. It decides everything: which
statements to send with which parameters, in which order, what the rows mean
and what an error means. It never touches a connection.

A driver (:mod:`worker_cli.db.drivers`) runs a plan on a connection: one for
``psycopg.Connection`` (:class:`~worker_cli.client.sync_worker_utils.SyncWorkerUtils`),
one for ``psycopg.AsyncConnection`` (:class:`~worker_cli.client.worker_utils.WorkerUtils`,
the worker's helpers and its start-up migration). That is the only code that
differs between the sync and async APIs, so validation, encoding, SQL and
decoding cannot drift apart. psycopg itself is built this way: its protocol
steps are generators, driven by a blocking and an asyncio wait function.

Why generators rather than functions that build a statement and decode rows:
several operations are sequences with logic between the steps (a job
statement, then the lookup of its names; the migrator's loop of revisions, each
in a transaction, with "another migrator got there first" caught and skipped),
and a generator keeps that logic in one place with ordinary ``try``/``for``.
A plan costs a generator and a few ``yield``s per call, and no round trip:
each operation is one statement, sent as the code sent it before plans
existed (the worker's ``helpers.add_job`` still makes two: the job, then its
names).

The operations are NamedTuples (a dataclass costs a worker's start-up about
30 times more to define). Plans use the small typed helpers below
(``rows = yield from query(...)``) rather than yielding operations themselves,
so mypy knows what each step gives.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, LiteralString, NamedTuple, TypeAlias, TypeVar

from psycopg import sql

__all__ = [
    "Fetch",
    "Op",
    "Plan",
    "Query",
    "Row",
    "Send",
    "Sent",
    "ServerVersion",
    "Transaction",
    "execute",
    "fetch",
    "protected",
    "query",
    "send",
    "server_version",
    "transaction",
]

T = TypeVar("T")

#: A row as the drivers return it (psycopg's ``tuple_row``, whatever row
#: factory the connection has).
Row: TypeAlias = tuple[Any, ...]


class Query(NamedTuple):
    """Send one statement; the result is its rows (``[]`` when ``rows`` is False:
    a statement run for its effect, such as a migration script)."""

    statement: sql.Composable | LiteralString
    params: Mapping[str, Any] | None = None
    #: Load ``json`` columns as their text, for :func:`worker_cli.jobs.job.decode_jobs`.
    raw_payloads: bool = False
    rows: bool = True
    #: Load times outside Python's years as the earliest or latest datetime
    #: (:mod:`worker_cli.db.timestamps`) rather than fail.
    lenient_times: bool = False


class Sent:
    """A statement sent by :class:`Send` whose rows are not read yet (the
    driver's cursor; opaque to plans)."""


class Send(NamedTuple):
    """Send a statement without waiting for its rows; the result is a handle
    for :class:`Fetch`. In a pipelined transaction the server works on it while
    the plan prepares the next one."""

    query: Query


class Fetch(NamedTuple):
    """The rows of a statement sent by :class:`Send`."""

    sent: Sent


class Transaction(NamedTuple):
    """Run ``plan`` atomically; the result is the plan's.

    On a connection the package owns this is ``conn.transaction()``: a
    transaction of its own, or a savepoint inside one already open. On the
    caller's connection (``connection=``) it is a savepoint inside the
    caller's transaction, which is never committed or rolled back here (in
    autocommit mode, with no transaction open, a transaction of its own:
    the caller chose autocommit).

    ``only_if_open``: only protect an open transaction from a failure the plan
    catches (a savepoint), and add nothing in autocommit mode.
    ``pipeline``: send the plan's statements in a pipeline.
    """

    plan: Plan[Any]
    pipeline: bool = False
    only_if_open: bool = False


class ServerVersion(NamedTuple):
    """The server's version number (``server_version_num``), known without a query."""


Op: TypeAlias = Query | Send | Fetch | Transaction | ServerVersion
Plan: TypeAlias = Generator[Op, Any, T]


def query(
    statement: sql.Composable | LiteralString,
    params: Mapping[str, Any] | None = None,
    *,
    raw_payloads: bool = False,
    lenient_times: bool = False,
) -> Plan[list[Row]]:
    """The rows of one statement."""
    rows: list[Row] = yield Query(statement, params, raw_payloads, lenient_times=lenient_times)
    return rows


def execute(
    statement: sql.Composable | LiteralString, params: Mapping[str, Any] | None = None
) -> Plan[None]:
    """Run one statement for its effect."""
    yield Query(statement, params, rows=False)


def send(
    statement: sql.Composable | LiteralString,
    params: Mapping[str, Any] | None = None,
    *,
    raw_payloads: bool = False,
) -> Plan[Sent]:
    """Send one statement now; read its rows later with :func:`fetch`."""
    sent: Sent = yield Send(Query(statement, params, raw_payloads))
    return sent


def fetch(sent: Sent) -> Plan[list[Row]]:
    """The rows of a statement sent by :func:`send`."""
    rows: list[Row] = yield Fetch(sent)
    return rows


def transaction(plan: Plan[T], *, pipeline: bool = False) -> Plan[T]:
    """Run ``plan`` atomically (see :class:`Transaction`)."""
    result: T = yield Transaction(plan, pipeline=pipeline)
    return result


def protected(plan: Plan[T]) -> Plan[T]:
    """Run ``plan`` so that an error it raises does not abort an open transaction
    (a savepoint inside one; nothing more in autocommit mode)."""
    result: T = yield Transaction(plan, only_if_open=True)
    return result


def server_version() -> Plan[int]:
    """The server's ``server_version_num``."""
    version: int = yield ServerVersion()
    return version
