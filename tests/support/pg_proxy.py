"""A TCP proxy in front of PostgreSQL that a test can break at a chosen moment.

``cut_reply(*columns)`` drops the connection right after the server has
answered (and, for an autocommit statement, committed) a query whose result
has those columns, without passing the answer on: the client cannot know
whether its statement took effect.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from typing import Any
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict


class PgProxy:
    """Forwards 127.0.0.1:``port`` to the server of ``upstream`` (a URL or
    conninfo: TCP, or a unix socket directory), in a thread of its own."""

    def __init__(self, upstream: str) -> None:
        params = conninfo_to_dict(upstream)
        host = str(params.get("host") or "/tmp")
        port = int(params.get("port") or 5432)
        self._unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._tcp = (host, port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._trap: tuple[frozenset[str], threading.Event] | None = None
        self._links: set[asyncio.Task[None]] = set()

    def __enter__(self) -> PgProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.cancel()
            await asyncio.gather(*self._links, return_exceptions=True)

        self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def url(self, upstream_url: str) -> str:
        """``upstream_url``'s user, password and database, through the proxy."""
        params = conninfo_to_dict(upstream_url)
        user = quote(str(params.get("user", "postgres")), safe="")
        password = params.get("password")
        auth = user + (":" + quote(str(password), safe="") if password else "")
        dbname = quote(str(params.get("dbname", "postgres")), safe="")
        return (
            f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}?sslmode=disable&gssencmode=disable"
        )

    def cut_reply(self, *columns: str) -> threading.Event:
        """Arm a one-shot trap: the next reply whose RowDescription names all of
        ``columns`` and that carries at least one row is held back; when its
        ReadyForQuery arrives (the statement has ended, an autocommit one has
        committed) both sides are closed and nothing of it is forwarded. The
        event is set then."""
        cut = threading.Event()
        self._trap = (frozenset(columns), cut)
        return cut

    # --- the proxy's loop -----------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            if self._unix:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._tcp)
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._pipe(reader, up_writer))
                    group.create_task(self._replies(up_reader, writer))
            finally:
                up_writer.close()
        except (OSError, _Cut, ExceptionGroup, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._links.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        raise _Cut  # the client left: end the link

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Server to client, message by message (type byte, int32 length)."""
        held: list[bytes] | None = None  # a matching reply being held back
        rows = 0
        while True:
            try:
                header = await reader.readexactly(5)
            except asyncio.IncompleteReadError:
                raise _Cut from None
            kind = header[:1]
            body = await reader.readexactly(struct.unpack("!I", header[1:])[0] - 4)
            message = header + body
            trap = self._trap
            if kind == b"T" and trap is not None and trap[0] <= _column_names(body):
                held, rows = [], 0
            if held is None:
                writer.write(message)
                await writer.drain()
                continue
            held.append(message)
            rows += kind == b"D"
            if kind == b"Z":
                if rows and trap is not None:
                    self._trap = None
                    trap[1].set()
                    raise _Cut  # closes both sides, forwarding nothing held
                for part in held:
                    writer.write(part)
                await writer.drain()
                held = None


class _Cut(Exception):
    """Ends a link (both of its sockets are closed)."""


def _column_names(body: bytes) -> frozenset[str]:
    """The column names of a RowDescription message body."""
    (count,) = struct.unpack("!H", body[:2])
    names, at = [], 2
    for _ in range(count):
        end = body.index(b"\0", at)
        names.append(body[at:end].decode())
        at = end + 1 + 18
    return frozenset(names)
