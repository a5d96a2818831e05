"""The dashboard in a Django project's ASGI application.

::

    application = Router(routes=[
        Mount("/admin/queue", app=dashboard_app()),  # active staff users only
        Mount("/", app=get_asgi_application()),
    ])

:func:`dashboard_app` is :func:`worker_cli.dashboard.create_app` on the
backend's database and schema, with Django's own login in front: a request
whose session (``django.contrib.sessions``) is not an active staff user's
(``django.contrib.auth``) gets a 403. Needs ``graphile-worker[dashboard]``.
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import import_module
from typing import Any

from django.conf import settings
from django.tasks import task_backends

from .connection import conninfo_of

__all__ = ["dashboard_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def dashboard_app(backend: str = "default", *, staff_only: bool = True, **options: Any) -> Any:
    """The dashboard of the jobs of TASKS[``backend``] (a GraphileWorkerBackend).
    ``staff_only`` (the default) answers only active staff users logged in to
    Django, others get a 403 (``False``: put your own check in front).
    ``options`` are :func:`~worker_cli.dashboard.create_app`'s (``read_only``,
    ``refresh``, ``csrf_secret``, ...)."""
    from ...dashboard import create_app
    from .backend import GraphileWorkerBackend

    configured = task_backends[backend]
    if not isinstance(configured, GraphileWorkerBackend):
        raise TypeError(f"TASKS[{backend!r}] is not a GraphileWorkerBackend")
    app = create_app(conninfo_of(configured.database), schema=configured.schema, **options)
    return StaffOnly(app) if staff_only else app


class StaffOnly:
    """An ASGI app answering only requests of an active staff user of Django's
    session; others get a 403 (``/healthz`` too: it says nothing of the queue
    worth hiding, but nothing is served unseen)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not await _is_staff(scope):
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": b"Forbidden: staff users only\n"})
            return
        await self.app(scope, receive, send)

    async def close(self) -> None:
        """Close the dashboard's connections (when the application stops)."""
        close = getattr(self.app, "close", None)
        if close is not None:
            await close()


async def _is_staff(scope: Scope) -> bool:
    from django.contrib.auth import aget_user
    from django.core.handlers.asgi import ASGIRequest

    request = ASGIRequest(dict(scope), io.BytesIO())
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    user = await aget_user(request)
    return bool(user.is_active and user.is_staff)
