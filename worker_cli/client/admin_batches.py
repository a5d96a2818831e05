"""The admin actions on jobs chosen by filter or by id, in bounded batches:
what the command line's admin commands (``graphile-worker retry``,
``reschedule``, ``fail``, ``remove``: :mod:`worker_cli.cli.admin_jobs`) and
the dashboard's bulk actions both run.

A filter's matches are counted (with those a worker holds, and the highest
id: an action goes no further), then walked by id, :data:`BATCH` ids at a
time, each batch a statement (and, on an autocommit connection, a
transaction) of its own: a filter matching 100,000 jobs never holds one long
transaction. The statements are :mod:`worker_cli.sql.admin`;
the actions go through graphile-worker's admin functions, so a job a worker
holds is left alone (and reported), as those functions leave it.

The work is written once, as plans (:mod:`worker_cli.db.plan`):
:class:`Session` runs them on an asyncio connection of its own (the command
line, the dashboard), :class:`SyncSession` on a caller's blocking connection,
joining its transaction (Django's admin).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, LiteralString, TypeVar

import psycopg

from ..db.drivers import run_plan, run_plan_async
from ..db.plan import Plan, Row, query
from ..jobs.job_state import STATE_ALIASES
from ..sql import admin as admin_sql
from ..sql import compose
from ..sql import jobs as jobs_sql

__all__ = ["BATCH", "Filters", "Matches", "Outcome", "Session", "SyncSession"]

T = TypeVar("T")

#: Job ids per action statement (and per transaction).
BATCH = 1000


@dataclass(frozen=True)
class Filters:
    """Which jobs: every given filter must hold (none given: every job)."""

    task: str | None = None
    queue: str | None = None
    state: str | None = None
    key: str | None = None
    ids: tuple[int, ...] = ()

    def params(self) -> dict[str, Any]:
        """The statements' filter parameters (None turns a filter off)."""
        return {
            "task": self.task,
            "queue": self.queue,
            "key": self.key,
            "ids": list(self.ids) if self.ids else None,
            # an earlier version's word (a bookmarked dashboard link) as its new one
            "state": STATE_ALIASES.get(self.state, self.state) if self.state else None,
        }

    def describe(self) -> str:
        """``task charge_card, state failed`` (for the prompt)."""
        parts = [
            f"{name} {value}"
            for name, value in (("task", self.task), ("queue", self.queue), ("state", self.state))
            if value is not None
        ]
        if self.key is not None:
            parts.append(f"key {self.key}")
        if self.ids:
            parts.append("id " + ", ".join(str(one) for one in self.ids))
        return ", ".join(parts) or "every job"


@dataclass
class Matches:
    """How many jobs a filter matches, how many a worker holds, and the
    highest id among them (an action goes no further)."""

    count: int
    held: int
    upto: int


@dataclass
class Outcome:
    """What an action did, job by job (ids in the order acted on)."""

    action: str
    #: Changed as asked.
    changed: list[int] = field(default_factory=list)
    #: Held by a worker (locked less than 4 hours ago): left alone.
    locked: list[int] = field(default_factory=list)
    #: No such job.
    missing: list[int] = field(default_factory=list)
    #: Left as it was: the action does not apply (``fail``: already failed
    #: for good), or it changed under the action (finished meanwhile).
    unchanged: list[int] = field(default_factory=list)
    #: ``remove --key`` of a job a worker holds: it keeps running, but lost
    #: its key and will not be retried (graphile-worker's remove_job).
    stopped: list[int] = field(default_factory=list)

    def add(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Add the rows of an action statement: (id, what became of it)."""
        for job_id, what in rows:
            getattr(self, what).append(int(job_id))

    def as_json(self) -> str:
        """The outcome as one JSON document (counts, then the ids)."""
        fields = asdict(self)
        counts = {name: len(ids) for name, ids in fields.items() if isinstance(ids, list)}
        return json.dumps({"action": self.action, "counts": counts, **fields})


def _rows(schema: str, statement: LiteralString, params: dict[str, Any]) -> Plan[list[Row]]:
    return (yield from query(compose(statement, schema), params))


def _matches(schema: str, filters: Filters) -> Plan[Matches]:
    [(count, held, upto)] = yield from _rows(schema, admin_sql.COUNT_JOBS, filters.params())
    return Matches(int(count), int(held), int(upto))


def _job_id_by_key(schema: str, key: str) -> Plan[int | None]:
    found = yield from _rows(schema, admin_sql.JOB_ID_BY_KEY, {"key": key})
    return int(found[0][0]) if found else None


def _installed(schema: str, statement: LiteralString) -> Plan[bool]:
    found = yield from _rows(schema, statement, {"schema": schema})
    return bool(found and found[0][0])


def _action(schema: str, action: str) -> Plan[LiteralString]:
    if action in ("remove", "retry") and (
        yield from _installed(schema, jobs_sql.ON_CALL_INSTALLED)
    ):
        return admin_sql.ACTIONS["remove+recorded" if action == "remove" else "retry+marked"]
    if action == "remove" and (yield from _installed(schema, jobs_sql.UNIQUE_TABLES_INSTALLED)):
        return admin_sql.ACTIONS["remove+unique"]
    return admin_sql.ACTIONS[action]


def _remove_by_key(schema: str, by: str, outcome: Outcome, key: str) -> Plan[bool]:
    if (yield from _installed(schema, jobs_sql.ON_CALL_INSTALLED)):
        statement = admin_sql.REMOVE_BY_KEY_RECORDED
    elif (yield from _installed(schema, jobs_sql.UNIQUE_TABLES_INSTALLED)):
        statement = admin_sql.REMOVE_BY_KEY_RELEASING
    else:
        statement = admin_sql.REMOVE_BY_KEY
    found = yield from _rows(schema, statement, {"key": key, "by": by})
    for job_id, held in found:
        (outcome.stopped if held else outcome.changed).append(int(job_id))
    return bool(found)


def _act(
    schema: str,
    by: str,
    outcome: Outcome,
    statement: LiteralString,
    ids: Sequence[int],
    params: dict[str, Any],
) -> Plan[None]:
    for start in range(0, len(ids), BATCH):
        batch = list(ids[start : start + BATCH])
        outcome.add((yield from _rows(schema, statement, {**params, "ids": batch, "by": by})))


def _act_on_matches(
    schema: str,
    by: str,
    outcome: Outcome,
    statement: LiteralString,
    filters: Filters,
    upto: int,
    params: dict[str, Any],
) -> Plan[None]:
    after = 0
    while True:
        found = yield from _rows(
            schema,
            admin_sql.NEXT_BATCH,
            {**filters.params(), "after": after, "upto": upto, "batch": BATCH},
        )
        if not found:
            return
        ids = [int(row[0]) for row in found]
        outcome.add((yield from _rows(schema, statement, {**params, "ids": ids, "by": by})))
        after = ids[-1]


class Session:
    """One autocommit connection to the queue's schema (each statement, so
    each batch, commits on its own). ``by`` is who acts (``cli``,
    ``dashboard``): kept with the jobs removed (their history row) and with
    the retries' markers among the attempt errors."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], schema: str, *, by: str = "cli") -> None:
        self.conn = conn
        self.schema = schema
        self.by = by

    async def rows(self, statement: LiteralString, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return await run_plan_async(self.conn, _rows(self.schema, statement, params))

    async def list_jobs(self, filters: Filters, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` matching jobs, newest first, as dicts."""
        statement = admin_sql.LIST_JOBS
        cursor = await self.conn.execute(
            compose(statement, self.schema), {**filters.params(), "limit": limit}
        )
        names = [column.name for column in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]

    async def matches(self, filters: Filters) -> Matches:
        return await run_plan_async(self.conn, _matches(self.schema, filters))

    async def job_id_by_key(self, key: str) -> int | None:
        return await run_plan_async(self.conn, _job_id_by_key(self.schema, key))

    async def unique_installed(self) -> bool:
        return await run_plan_async(
            self.conn, _installed(self.schema, jobs_sql.UNIQUE_TABLES_INSTALLED)
        )

    async def on_call_installed(self) -> bool:
        """Whether the schema records removals and retries (Python migration 23)."""
        return await run_plan_async(self.conn, _installed(self.schema, jobs_sql.ON_CALL_INSTALLED))

    async def action(self, action: str) -> LiteralString:
        """The statement of ``action``: where the schema has the objects for
        it, ``remove`` also releases the removed jobs' uniqueness locks and
        records them as removed, and ``retry`` marks where a job's attempt
        numbers start again."""
        return await run_plan_async(self.conn, _action(self.schema, action))

    async def remove_by_key(self, outcome: Outcome, key: str) -> bool:
        """``remove --key``: graphile-worker's remove_job; whether there was a job."""
        return await run_plan_async(self.conn, _remove_by_key(self.schema, self.by, outcome, key))

    async def act(
        self, outcome: Outcome, statement: LiteralString, ids: Sequence[int], **params: Any
    ) -> None:
        """The action on ``ids``, :data:`BATCH` at a time, into ``outcome``."""
        await run_plan_async(self.conn, _act(self.schema, self.by, outcome, statement, ids, params))

    async def act_on_matches(
        self, outcome: Outcome, statement: LiteralString, filters: Filters, upto: int, **params: Any
    ) -> None:
        """The action on the jobs ``filters`` match, up to id ``upto``, by id
        order: the next :data:`BATCH` matching ids, then the action on them,
        until none is left (a job changed leaves the filter or lies behind)."""
        await run_plan_async(
            self.conn,
            _act_on_matches(self.schema, self.by, outcome, statement, filters, upto, params),
        )


class SyncSession:
    """:class:`Session`'s actions, blocking, on a caller's connection (the
    Django admin's: ``django.db.connection.connection``), which is used as it
    is: its transaction is joined (each batch a statement of it; in
    autocommit mode each commits on its own), never committed or rolled back
    here. The same statements, in the same batches."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str, *, by: str) -> None:
        self.conn = conn
        self.schema = schema
        self.by = by

    def _run(self, plan: Plan[T]) -> T:
        return run_plan(self.conn, plan, joined=True)

    def matches(self, filters: Filters) -> Matches:
        """How many jobs ``filters`` match (see :class:`Matches`)."""
        return self._run(_matches(self.schema, filters))

    def action(self, action: str) -> LiteralString:
        """The statement of ``action`` (see :meth:`Session.action`)."""
        return self._run(_action(self.schema, action))

    def act(
        self, outcome: Outcome, statement: LiteralString, ids: Sequence[int], **params: Any
    ) -> None:
        """The action on ``ids``, :data:`BATCH` at a time, into ``outcome``."""
        self._run(_act(self.schema, self.by, outcome, statement, ids, params))
