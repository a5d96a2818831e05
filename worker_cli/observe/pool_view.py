"""What the observers (metrics, queue depth, the progress line) read of a
worker pool: a protocol that :class:`~worker_cli.worker.WorkerPool` meets,
so that nothing here imports the worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..client.worker_utils import WorkerUtils
    from ..config.options import WorkerOptions
    from .events import Events

__all__ = ["ObservedPool", "PoolLoadView"]


class PoolLoadView(Protocol):
    """Jobs running now, fetched jobs waiting for a slot, and running jobs
    that should have stopped (stuck)."""

    @property
    def running(self) -> int: ...

    @property
    def queued(self) -> int: ...

    @property
    def stuck(self) -> int: ...

    @property
    def running_tasks(self) -> Mapping[str, int]: ...


class ObservedPool(Protocol):
    """A running worker pool, as its observers see it."""

    @property
    def id(self) -> str: ...

    @property
    def tasks(self) -> Mapping[str, Any]: ...

    @property
    def options(self) -> WorkerOptions: ...

    @property
    def events(self) -> Events: ...

    @property
    def utils(self) -> WorkerUtils | None: ...

    @property
    def jobs_done(self) -> int: ...

    @property
    def load(self) -> PoolLoadView: ...
