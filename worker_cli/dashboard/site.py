"""What the pages and the actions use of the dashboard: a protocol that
:class:`~worker_cli.dashboard.app.Dashboard` meets. The app wires the routes
of ``pages`` and ``actions``; they see it only through this, so none of them
imports the app back."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ..client.worker_utils import WorkerUtils
    from .inputs import BadInput
    from .notices import Flash
    from .page_data import Reader
    from .security import AllowedHosts, Csrf

__all__ = ["Site"]


class Site(Protocol):
    """The dashboard as its routes see it."""

    read_only: bool
    csrf: Csrf
    flash: Flash
    hosts: AllowedHosts | None

    def reading(self, *, check_schema: bool = False) -> AbstractAsyncContextManager[Reader]:
        """A reader in one read-only snapshot (see ``Dashboard.reading``)."""
        ...

    async def utils(self) -> WorkerUtils:
        """The admin functions on the dashboard's pool."""
        ...

    async def healthy(self) -> str | None:
        """None if the database answers and the schema can be shown, else why not."""
        ...

    def url(self, request: Request, path: str, query: Mapping[str, Any] | None = None) -> str:
        """A link inside the dashboard."""
        ...

    def render(
        self,
        request: Request,
        template: str,
        *,
        status: int = 200,
        refresh: bool = False,
        **context: Any,
    ) -> Response:
        """A page."""
        ...

    def no_such_job(self, request: Request, text: str) -> Response:
        """The 404 of a job id."""
        ...

    def bad_input(self, request: Request, exc: BadInput) -> Response:
        """The 400 of a value the dashboard cannot use."""
        ...
