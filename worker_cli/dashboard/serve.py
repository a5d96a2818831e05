"""``graphile-worker dashboard``: the dashboard served by uvicorn.

Before it serves, it refuses an address other than loopback without
authentication, binds its port (one taken fails with one line, not uvicorn's
log), and checks once that the database answers and holds a schema it can
show, so a wrong URL fails at once with one line rather than as an error page
later.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Iterable
from pathlib import Path

import uvicorn

from ..config.database import resolve_connection_string, resolve_schema
from ..db.connections import connect
from ..errors import ConfigurationError, GraphileWorkerError
from ..observe import log_output as logs
from .app import create_app
from .crontab_page import load_crontab
from .page_data import Reader
from .security import AUTH_ENVVAR, AllowedHosts, BasicAuth, is_loopback

__all__ = ["bind", "bound_port", "check_database", "serve"]

logger = logging.getLogger("graphile_worker.dashboard")


def refuse_unprotected(host: str, auth: BasicAuth | None) -> None:
    """Only loopback may be served without authentication."""
    if auth is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without authentication: anyone who "
            f"can reach it could see and change the queue; set --auth USER:PASSWORD (or "
            f"{AUTH_ENVVAR}), or listen on 127.0.0.1"
        )


def bind(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` names (as asyncio would bind
    them for uvicorn), not yet listening; ConfigurationError in one line when
    the port is taken or the address cannot be used. Port 0: a free port the
    system picks, the same for every address (see :func:`bound_port`)."""
    shown = f"[{host}]" if ":" in host else host
    where = f"cannot serve the dashboard on {shown}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ConfigurationError(f"--host: {where}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # the port the first one got
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:  # else: that family is off here
                    raise
                sockets.pop().close()
        if not sockets:
            raise OSError(errno.EADDRNOTAVAIL, "no address to listen on")
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigurationError(
                f"--port: {where}: port {port} is already in use (choose another with --port)"
            ) from None
        raise ConfigurationError(f"--host: {where}: {exc.strerror or exc}") from None
    return sockets


def bound_port(sockets: list[socket.socket]) -> int:
    """The port ``sockets`` are bound to (the one picked for port 0)."""
    return int(sockets[0].getsockname()[1])


async def check_database(connection_string: str, schema: str) -> None:
    """Connect once and check the schema; GraphileWorkerError saying why not."""
    conn = await connect(connection_string)
    try:
        async with conn.transaction():
            problem = await Reader(conn, schema).schema_problem()
    finally:
        await conn.close()
    if problem is not None:
        raise GraphileWorkerError(problem)


def serve(
    connection_string: str | None,
    *,
    schema: str | None,
    host: str,
    port: int,
    read_only: bool,
    auth: BasicAuth | None,
    refresh: float,
    allowed_hosts: Iterable[str] = (),
    no_prepared_statements: bool = False,
    crontab_file: Path | None = None,
    cron_timezone: str = "UTC",
) -> None:
    """Serve the dashboard until interrupted (Ctrl-C, SIGTERM). It answers
    to its own address, ``localhost`` and ``allowed_hosts`` (a 400 to any
    other ``Host``: DNS rebinding). ``crontab_file``: the workers' crontab,
    read and checked before it listens (a bad one fails as the worker's does)."""
    refuse_unprotected(host, auth)
    try:
        hosts = AllowedHosts([host, *allowed_hosts])
    except ValueError as exc:
        raise ConfigurationError(f"--allowed-host: {exc}") from None
    conninfo = resolve_connection_string(connection_string)
    schema_name = resolve_schema(schema)
    load_crontab(crontab_file=crontab_file, cron_timezone=cron_timezone)  # fails at once
    sockets = bind(host, port)
    try:
        asyncio.run(check_database(conninfo, schema_name))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    logs.configure("text")
    app = create_app(
        conninfo,
        schema=schema_name,
        read_only=read_only,
        auth=auth,
        refresh=refresh,
        allowed_hosts=sorted(hosts.names),
        no_prepared_statements=no_prepared_statements,
        crontab_file=crontab_file,
        cron_timezone=cron_timezone,
    )
    shown = f"[{host}]" if ":" in host else host
    port = bound_port(sockets)
    logger.info(
        "Dashboard of schema %r on http://%s:%d/%s%s",
        schema_name,
        shown,
        port,
        " (read-only)" if read_only else "",
        " (HTTP Basic authentication)" if auth else "",
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        server_header=False,
        lifespan="on",
    )
    uvicorn.Server(config).run(sockets=sockets)
