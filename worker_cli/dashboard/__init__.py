"""The web dashboard: ``graphile-worker dashboard``, or an ASGI app to mount.

Needs the ``dashboard`` extra (``pip install 'graphile-worker[dashboard]'``, or
``pip install '.[dashboard]'`` in a checkout):
Starlette, uvicorn and Jinja2. Nothing else in the package imports it.

- :mod:`.app`: :class:`Dashboard` and :func:`create_app`, the ASGI application;
- :mod:`.pages` and :mod:`.actions`: what it serves (GET pages; confirmed POSTs);
- :mod:`.pause_actions`: pausing and resuming a named queue or a task (POSTs);
- :mod:`.limit_actions`: setting and removing a task's or a queue's limit (POSTs);
- :mod:`.notices`: the banner after an action (done, or refused);
- :mod:`.page_data`, :mod:`.filters`, :mod:`.job_counts`: what it reads, every
  statement bounded and index-backed, counts exact or sampled;
- :mod:`.finished`: the Finished view's filter, cursor and page (the history);
- :mod:`.workflow_pages`, :mod:`.workflow_graph`, :mod:`.workflow_actions`:
  the Workflows pages (a workflow's steps drawn as an SVG graph), cancel and
  retry;
- :mod:`.inputs`: values from URLs and forms, checked before the database;
- :mod:`.security`: authentication, CSRF, security headers, loopback-only;
- :mod:`.serve`: the standalone server behind the command;
- ``templates/`` and ``static/``: the pages, their stylesheet and script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .security import BasicAuth

if TYPE_CHECKING:
    from .app import Dashboard, create_app

__all__ = ["BasicAuth", "Dashboard", "create_app"]


def __getattr__(name: str) -> Any:
    """``Dashboard`` and ``create_app`` import Starlette: only when asked for, so
    that ``.security`` (the CLI's ``--auth`` parsing) needs no extra."""
    if name in ("Dashboard", "create_app"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
