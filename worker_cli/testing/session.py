"""Where :mod:`worker_cli.testing` runs its statements: the caller's session,
or one of its own; and the event loop of its sync forms.

A test gives its connection so that the jobs its code added in an open
transaction (a Django ``TestCase``'s, rolled back at its end) are seen, run
and finished in that transaction. The runner is the worker's async code, so
it talks to that session through async connections made over the very same
libpq connection (:func:`session_twins`): the caller's transaction, its
savepoints and its locks, with psycopg's state of its own (its ``json``
loaders, no prepared statements) that never touches the caller's connection
object. They are used only while the caller waits for the runner, so the
session is never used by two at once; the caller's notice and notification
handlers are put back when they are done with.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg

from ..config.database import load_dotenv_file, resolve_connection_string
from ..errors import ConfigurationError

__all__ = ["LoopThread", "own_or_given", "session_twins", "unwrap_connection"]

T = TypeVar("T")


def unwrap_connection(connection: object, *, function: str, asynchronous: bool) -> Any:
    """The psycopg connection of ``connection``: itself, or the one inside
    Django's connection wrapper (``django.db.connection``, opened if it is not
    yet). Anything else: one :class:`~worker_cli.errors.ConfigurationError`."""
    if type(connection).__module__.startswith("django") and hasattr(
        connection, "ensure_connection"
    ):
        connection.ensure_connection()
        connection = getattr(connection, "connection", None)
    expected = psycopg.AsyncConnection if asynchronous else psycopg.Connection
    if isinstance(connection, expected) and not connection.closed:
        return connection
    wanted = "an open psycopg.AsyncConnection" if asynchronous else "an open psycopg.Connection"
    got = type(connection).__name__
    hint = ""
    if not asynchronous and isinstance(connection, psycopg.AsyncConnection):
        hint = " (an async connection: use run_jobs_async and the *_async assertions)"
    elif asynchronous and isinstance(connection, psycopg.Connection):
        hint = " (a sync connection: use run_jobs and the sync assertions)"
    elif isinstance(connection, psycopg.Connection | psycopg.AsyncConnection):
        got = "a closed connection"
    elif not type(connection).__module__.startswith("django"):
        hint = " (or Django's django.db.connection)" if not asynchronous else ""
    raise ConfigurationError(f"{function}(connection=...) expects {wanted}; got {got}{hint}")


@contextmanager
def session_twins(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], count: int
) -> Iterator[list[psycopg.AsyncConnection[Any]]]:
    """``count`` async connections over ``conn``'s session (see the module),
    in its autocommit mode; the session's notice and notification handlers
    are ``conn``'s again on exit."""
    pgconn = conn.pgconn
    handlers = (pgconn.notice_handler, pgconn.notify_handler)
    twins = []
    try:
        for _ in range(count):
            twin: psycopg.AsyncConnection[Any] = psycopg.AsyncConnection(pgconn)
            # Its transaction state is the session's: psycopg opens a
            # transaction before a statement only where conn would.
            twin._autocommit = conn.autocommit
            twin.prepare_threshold = None  # the caller's prepared names are its own
            # Not closed when dropped (the session is conn's), and not warned
            # about: psycopg's own mark of a connection it does not own.
            twin._pool = None
            twins.append(twin)
        yield twins
    finally:
        pgconn.notice_handler, pgconn.notify_handler = handlers


@asynccontextmanager
async def own_or_given(
    connection_string: str | None,
    given: psycopg.Connection[Any] | psycopg.AsyncConnection[Any] | None,
    count: int,
) -> AsyncIterator[list[psycopg.AsyncConnection[Any]]]:
    """Twins of ``given``'s session, or of a new autocommit connection to
    ``connection_string`` (default: ``DATABASE_URL``), closed on exit."""
    if given is not None:
        with session_twins(given, count) as twins:
            yield twins
        return
    load_dotenv_file()
    conninfo = resolve_connection_string(connection_string)
    own = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    try:
        with session_twins(own, count) as twins:
            yield twins
    finally:
        await own.close()


class LoopThread:
    """An event loop in a thread of its own for the sync forms, stopped and
    joined on exit (nothing is left behind): the caller's thread stays free
    to call plain ``def`` tasks, as a worker's task thread would."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="graphile-worker-testing-loop", daemon=True
        )

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # On the loop's own thread: the caller's may be running a loop of its
        # own (a sync run_jobs called from an async test).
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop; wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()
