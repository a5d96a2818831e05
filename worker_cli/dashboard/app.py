"""The dashboard as an ASGI application: standalone under uvicorn
(``graphile-worker dashboard``), or mounted in a FastAPI or Starlette
application under a path prefix.

Mounted apps get no lifespan events from Starlette, so the dashboard opens
its connection pool on its first request, and closes it on a lifespan
shutdown when it runs standalone, or when the application calls
:meth:`Dashboard.close` (see the README's example).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ..client.worker_utils import WorkerUtils
from ..config.database import resolve_connection_string, resolve_schema
from ..db.backoff import one_line
from ..db.connections import worker_conninfo
from ..db.timestamps import read_timestamps_leniently
from ..sql import pauses as pauses_sql
from ..sql import sessions as sessions_sql
from . import (
    actions,
    bulk_actions,
    crontab_page,
    limit_actions,
    pages,
    pause_actions,
    schedule_actions,
    throughput,
    workflow_actions,
    workflow_pages,
)
from .error_chain import error_chain
from .formatting import FILTERS
from .inputs import BIGINT, BadInput, parse_job_id, shown
from .notices import Flash, cookie_path
from .page_data import Reader
from .security import AllowedHosts, BasicAuth, Csrf, Receive, Scope, SecurityHeaders, Send

__all__ = ["Dashboard", "SchemaProblem", "create_app"]

PACKAGE = Path(__file__).resolve().parent


class SchemaProblem(Exception):
    """The database has no schema the dashboard can show (not installed, or
    older than this version)."""


class Dashboard:
    """The dashboard: an ASGI application (see :func:`create_app`)."""

    def __init__(
        self,
        connection_string: str | None = None,
        *,
        schema: str | None = None,
        read_only: bool = False,
        auth: BasicAuth | str | None = None,
        refresh: float = 5.0,
        csrf_secret: bytes | None = None,
        max_connections: int = 4,
        allowed_hosts: Iterable[str] | None = None,
        no_prepared_statements: bool = False,
        crontab: str | None = None,
        crontab_file: str | Path | None = None,
        cron_timezone: str = "UTC",
    ) -> None:
        self.crontab = crontab_page.load_crontab(crontab, crontab_file, cron_timezone)
        #: The zone of the cron items and schedules without one (--cron-timezone).
        self.cron_zone = crontab_page.cron_zone(cron_timezone)
        self.conninfo = resolve_connection_string(connection_string)
        self.no_prepared_statements = no_prepared_statements
        self.schema = resolve_schema(schema)
        self.read_only = read_only
        self.refresh = refresh
        self.csrf = Csrf(csrf_secret)
        self.flash = Flash(self.csrf)
        self.max_connections = max_connections
        if isinstance(auth, str):
            auth = BasicAuth.parse(auth)
        self.auth = auth
        self.hosts = None if allowed_hosts is None else AllowedHosts(allowed_hosts)
        self._pool: AsyncConnectionPool[Any] | None = None
        self._pool_lock = asyncio.Lock()
        self._schema_checked = False
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(PACKAGE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters.update(FILTERS, error_chain=error_chain)
        inner = Starlette(
            routes=[
                *throughput.routes(self),  # the overview, with its chart
                *crontab_page.routes(self, self.crontab, self.cron_zone),
                *schedule_actions.routes(self, self.crontab, self.cron_zone),
                *pages.routes(self),
                *actions.routes(self),
                *bulk_actions.routes(self),
                *pause_actions.routes(self),
                *limit_actions.routes(self),
                *workflow_pages.routes(self),
                *workflow_actions.routes(self),
                Mount("/static", app=StaticFiles(directory=PACKAGE / "static"), name="static"),
            ],
            exception_handlers={
                HTTPException: self._http_error,
                SchemaProblem: self._unavailable,
                psycopg.Error: self._unavailable,
                PoolTimeout: self._unavailable,
            },
            lifespan=self._lifespan,
        )
        self.templates.globals.update(page="", notice=None, held_by=pauses_sql.HELD_BY)
        self._app = SecurityHeaders(inner, auth, self.hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    # --- the database -----------------------------------------------------------

    async def _open_pool(self) -> AsyncConnectionPool[Any]:
        async with self._pool_lock:
            if self._pool is None:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    worker_conninfo(self.conninfo, "graphile-worker dashboard"),
                    min_size=1,
                    max_size=self.max_connections,
                    kwargs=(
                        {"autocommit": True, "prepare_threshold": None}
                        if self.no_prepared_statements
                        else {"autocommit": True}
                    ),
                    configure=self._configure,
                    open=False,
                    timeout=10,
                    name="graphile-worker-dashboard",
                )
                await pool.open(wait=False)
                self._pool = pool
            return self._pool

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Timestamps outside Python's range (a job due at ``-infinity``) read
        as the earliest or latest datetime; with ``--read-only`` the
        connections themselves refuse to write, unless they go through a pooler
        (``no_prepared_statements``), where a session setting would stay on a
        server connection other clients are lent next: then the actions are
        refused by the dashboard alone, and every page reads in a read-only
        transaction."""
        read_timestamps_leniently(conn)
        if self.read_only and not self.no_prepared_statements:
            await conn.execute(sessions_sql.READ_ONLY_SESSION)

    async def close(self) -> None:
        """Close the connection pool (opened again on the next request)."""
        async with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    @asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.close()

    @asynccontextmanager
    async def reading(self, *, check_schema: bool = False) -> AsyncIterator[Reader]:
        """A :class:`Reader` in a read-only, repeatable-read transaction (one
        snapshot for the whole page). Raises SchemaProblem when the schema
        cannot be shown: checked on the first page, again after a database
        error (the schema may have been dropped), and always with
        ``check_schema`` (``/healthz``)."""
        pool = await self._open_pool()
        async with pool.connection() as conn, conn.transaction():
            await conn.execute(sessions_sql.READ_ONLY_SNAPSHOT)
            reader = Reader(conn, self.schema)
            if check_schema or not self._schema_checked:
                problem = await reader.schema_problem()
                self._schema_checked = problem is None
                if problem is not None:
                    raise SchemaProblem(problem)
            yield reader

    async def utils(self) -> WorkerUtils:
        """The admin functions (WorkerUtils) on the dashboard's pool."""
        return WorkerUtils(await self._open_pool(), self.schema)

    async def healthy(self) -> str | None:
        """None if the database answers and the schema can be shown, else why
        not; asks the database each time (two catalog-sized statements)."""
        try:
            async with self.reading(check_schema=True):
                pass
        except (psycopg.Error, PoolTimeout, SchemaProblem) as exc:
            return one_line(exc)
        return None

    # --- responses --------------------------------------------------------------

    def url(self, request: Request, path: str, query: Mapping[str, Any] | None = None) -> str:
        """A link inside the dashboard, under the prefix it is mounted at."""
        root: str = request.scope.get("root_path", "")
        link = root.rstrip("/") + path
        if query:
            link += "?" + urlencode({k: v for k, v in query.items() if v not in (None, "")})
        return link

    def render(
        self,
        request: Request,
        template: str,
        *,
        status: int = 200,
        refresh: bool = False,
        **context: Any,
    ) -> Response:
        """A page; sets the CSRF cookie if the browser has none yet, and shows
        (and clears) the notice an action's redirect left for it."""
        notice, clear = self.flash.read(request)
        if notice is not None:
            context["notice"] = notice
        nonce = request.cookies.get(Csrf.COOKIE)
        new_nonce = None
        if not nonce:
            nonce = new_nonce = Csrf.new_nonce()
        html = self.templates.get_template(template).render(
            request=request,
            url=lambda path, **query: self.url(request, path, query),
            csrf_field=Csrf.FIELD,
            csrf_token=self.csrf.token(nonce),
            read_only=self.read_only,
            schema=self.schema,
            refresh=self.refresh if refresh else 0,
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if clear:
            self.flash.clear(request, response)
        if new_nonce is not None:
            response.set_cookie(
                Csrf.COOKIE,
                new_nonce,
                path=cookie_path(request),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def no_such_job(self, request: Request, text: str) -> Response:
        """The 404 of a job id: none has it (not a whole number in bigint's
        range), or no row has it, in the jobs table or the history (the
        job is ``unknown``, as ``py_job_status`` says)."""
        job_id = parse_job_id(text)
        title = "No such job"
        if job_id is None:
            reason = f"{shown(text)} is not a job id (a whole number from 1 to {BIGINT})"
        else:
            title = "Unknown job"
            reason = (
                f"job {job_id} is unknown: no row has it, in the jobs table or in the history "
                "of finished jobs. A Node worker (or a Python worker with --history off) "
                "completed it, an admin function or the dashboard's Delete removed it, its "
                "history was pruned (kept a day; failed jobs 7 days), or it never existed"
            )
        return self.render(
            request,
            "error.html",
            status=404,
            title=title,
            reason=reason,
        )

    def bad_input(self, request: Request, exc: BadInput) -> Response:
        """The 400 of a value the dashboard cannot use."""
        return self.render(request, "error.html", status=400, title="Bad input", reason=str(exc))

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """An address no page has (404), a method no page takes (405)."""
        assert isinstance(exc, HTTPException)
        title = HTTPStatus(exc.status_code).phrase.capitalize()
        reason = str(exc.detail).rstrip(".")
        if exc.status_code == 404:
            reason = "no page of the dashboard has this address"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            reason = f"this address does not take a {request.method} request (only {allowed})"
        response = self.render(
            request, "error.html", status=exc.status_code, title=title, reason=reason
        )
        response.headers.update(exc.headers or {})
        return response

    async def _unavailable(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, SchemaProblem):
            reason = str(exc)
        else:
            self._schema_checked = False  # a dropped schema is said so on the next page
            reason = f"the database is unreachable or refused the query: {one_line(exc)}"
        return self.render(request, "error.html", status=503, title="Unavailable", reason=reason)


def create_app(
    connection_string: str | None = None,
    *,
    schema: str | None = None,
    read_only: bool = False,
    auth: BasicAuth | str | None = None,
    refresh: float = 5.0,
    csrf_secret: bytes | None = None,
    max_connections: int = 4,
    allowed_hosts: Iterable[str] | None = None,
    no_prepared_statements: bool = False,
    crontab: str | None = None,
    crontab_file: str | Path | None = None,
    cron_timezone: str = "UTC",
) -> Dashboard:
    """The dashboard as an ASGI application.

    ``connection_string`` and ``schema`` default as the worker's do
    (``DATABASE_URL``, the ``PG*`` variables; ``GRAPHILE_WORKER_SCHEMA``).
    ``read_only`` hides the actions and refuses them (its connections are
    read-only too). ``auth`` (``"USER:PASSWORD"`` or a :class:`BasicAuth`)
    asks every request but ``/healthz`` for HTTP Basic credentials; leave it
    out when the application mounting the dashboard authenticates in front of
    it. ``refresh``: seconds between the pages' self-refreshes (0: never).
    ``csrf_secret``: the key of the forms' tokens; give the same one to every
    process serving the dashboard behind one load balancer (default: random
    per process). ``allowed_hosts``: the host names the dashboard answers to
    (besides ``localhost`` and the address a request reached); any other
    ``Host`` gets a 400, which defeats DNS rebinding. None (the default):
    no check, for a dashboard mounted in an application that checks hosts or
    authenticates in front of it. ``no_prepared_statements``: the connection string
    goes through a pooler in transaction mode (PgBouncer): no prepared statement and
    no session setting is made. ``crontab`` (its text) or ``crontab_file``: the
    workers' crontab, shown on the Crontab page with each item's schedule, time zone
    and next run (lines without ``?tz=`` in ``cron_timezone``, the workers'
    ``--cron-timezone``); a bad one raises CrontabError as in the worker. The Crontab
    page lists the schedules in the database too (``add_schedule``), and adds, changes,
    pauses, resumes and removes them unless ``read_only``. Mount it
    with ``app.mount("/queue", dashboard)``; close its connections with
    ``await dashboard.close()`` when the application stops.
    """
    return Dashboard(
        connection_string,
        schema=schema,
        read_only=read_only,
        auth=auth,
        refresh=refresh,
        csrf_secret=csrf_secret,
        max_connections=max_connections,
        allowed_hosts=allowed_hosts,
        no_prepared_statements=no_prepared_statements,
        crontab=crontab,
        crontab_file=crontab_file,
        cron_timezone=cron_timezone,
    )
