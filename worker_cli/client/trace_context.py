"""Trace contexts carried from ``add_job`` to the job's span, beside the job.

The payload is never touched: a Node task reading the same job sees exactly
what was added. The caller's context (the propagator's carrier, e.g.
``{"traceparent": "00-..."}``) goes into ``_private_py_job_trace_contexts``
(``migrations/py/000006.sql``), keyed by the job's id and written by the same
statement that adds the job, so a worker never sees the job without it.

Two halves, neither of which imports OpenTelemetry (:mod:`worker_cli.observe.otel`
does, and switches them on):

- :func:`carry`, the adding side. Off (the default) it hands back the add
  statement as it is: one test of a module global per ``add_job`` (it also
  puts a job's options beside the add, see :mod:`.job_options`). Once
  :func:`worker_cli.observe.otel.propagate_trace_context` has set the injector, a
  call made while a span (or baggage) is current gets the statement wrapped
  so that it also stores the carrier.
- :class:`JobContexts`, the worker side (``run(..., tracing=True)``): the
  fetcher calls :meth:`JobContexts.load` right after each fetch, on its own
  connection, with the jobs the fetch locked. One statement reads their
  carriers and deletes those of the jobs that succeeded since the previous
  fetch; every 8-10 minutes another deletes the rows whose job is gone
  (completed by Node, by a worker without tracing, by an administrator).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, LiteralString

import psycopg

from ..db.backoff import one_line
from ..jobs.job import Job
from ..sql import compose
from ..sql import trace_contexts as trace_sql
from ..sql.carried import OptionRows, carrying

__all__ = ["JobContexts", "carry", "set_injector"]

logger = logging.getLogger("graphile_worker.tracing")

#: Fills a carrier with the current trace context (``opentelemetry.propagate.inject``).
Injector = Callable[[dict[str, str]], None]

_inject: Injector | None = None


def set_injector(inject: Injector | None) -> None:
    """Carry the current trace context with every job added from now on
    (None: stop). Called by :func:`worker_cli.observe.otel.propagate_trace_context`."""
    global _inject
    _inject = inject


def carry(
    statement: LiteralString,
    *,
    unique: bool = False,
    order_by: LiteralString = "",
    options: OptionRows | None = None,
    replaces: bool = False,
) -> tuple[LiteralString, dict[str, Any]]:
    """The add statement to send, and the parameters to add to it: ``statement``
    and none when propagation is off or no trace context is current; else the
    statement that also stores the carrier (``trace_context``) for each job it
    adds. ``unique``: ``statement`` returns unique results (a job that was
    not added because of a conflict keeps its own context). ``order_by``: a
    column of its rows to order the result by (the rows of a statement that
    carries a context are ordered outside it). ``options``: the statement
    also writes the jobs' options (see :mod:`.job_options`), whose parameters
    the caller gives. ``replaces``: the call may replace jobs through their
    key; with propagation on and no context current, those jobs lose the
    context an earlier call stored."""
    order: LiteralString = " order by " + order_by if order_by else ""
    inject = _inject
    if inject is None and options is None:
        return statement + order, {}
    carrier: dict[str, str] = {}
    if inject is not None:
        inject(carrier)
    forget = replaces and not carrier
    if not carrier and options is None and not forget:
        return statement + order, {}
    params = {"trace_context": json.dumps(carrier)} if carrier else {}
    return carrying(statement, unique, bool(carrier), options, forget) + order, params


#: Seconds between two collections of left-over rows: a random value in this range.
GARBAGE_INTERVAL = (480.0, 600.0)
#: Rows one collection deletes at most; when it deletes that many, the next
#: one comes a second later.
GARBAGE_LIMIT = 10_000


class JobContexts:
    """The trace contexts of the jobs one worker pool fetched.

    :meth:`load` runs on the event loop (the fetcher); :meth:`pop` and
    :meth:`succeeded` run wherever the job runs, a task thread too (single
    dict and deque operations, atomic in CPython).
    """

    def __init__(self, schema: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._read = compose(trace_sql.READ_CONTEXTS, schema)
        self._collect = compose(trace_sql.COLLECT_CONTEXTS, schema)
        self._clock = clock
        self._carriers: dict[int, dict[str, str]] = {}
        self._succeeded: deque[int] = deque()
        self._next_collection = clock() + random.uniform(*GARBAGE_INTERVAL)

    def pop(self, job_id: int) -> dict[str, str] | None:
        """The carrier stored with the job (None: it was added without one)."""
        return self._carriers.pop(job_id, None)

    def succeeded(self, job_id: int) -> None:
        """The job (which had a carrier) succeeded: its row goes at the next fetch."""
        self._succeeded.append(job_id)

    async def load(self, conn: psycopg.AsyncConnection[Any], jobs: Sequence[Job]) -> None:
        """After a fetch, on the fetcher's connection: learn the fetched jobs'
        carriers. A failure is logged and the jobs run without their caller's
        trace; only a broken connection is raised (the fetcher then treats the
        fetch as lost and finds its jobs again)."""
        done = [self._succeeded.popleft() for _ in range(len(self._succeeded))]
        try:
            if jobs or done:
                cur = await conn.execute(
                    self._read, {"ids": [job.id for job in jobs], "done": done}
                )
                for job_id, carrier in await cur.fetchall():
                    self._carriers[job_id] = carrier
            if self._clock() >= self._next_collection:
                await self._collect_garbage(conn)
        except Exception as exc:
            if conn.broken or conn.closed:
                raise
            self._succeeded.extend(done)
            logger.warning(
                "Could not read the trace contexts of %d job(s); they run without their "
                "caller's trace: %s",
                len(jobs),
                one_line(exc),
            )

    async def _collect_garbage(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # Set first: a failed collection waits for the next interval too.
        self._next_collection = self._clock() + random.uniform(*GARBAGE_INTERVAL)
        cur = await conn.execute(self._collect, {"limit": GARBAGE_LIMIT})
        if cur.rowcount >= GARBAGE_LIMIT:  # more are left: go on soon
            self._next_collection = self._clock() + 1.0
        if cur.rowcount > 0:
            logger.debug("Deleted %d left-over trace context(s)", cur.rowcount)
