"""Events a running worker emits, named as graphile-worker's (``job:success``, ...)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

__all__ = ["EventHandler", "Events"]

logger = logging.getLogger("graphile_worker.events")

EventHandler = Callable[[dict[str, Any]], Any]


class Events:
    """A small event emitter: ``events.on("job:success", handler)``.

    Handlers receive one dict (``{"job": ..., "worker_id": ...}``). A handler
    may be a coroutine function; its coroutine runs as a task this emitter
    owns, and :meth:`aclose` waits for those still running. A failing handler
    is logged and never breaks the worker.
    """

    def __init__(self) -> None:
        self._handlers: defaultdict[str, list[EventHandler]] = defaultdict(list)
        self._tasks: set[asyncio.Task[Any]] = set()

    def on(self, name: str, handler: EventHandler) -> EventHandler:
        """Call ``handler`` on every ``name`` event; returns it (usable as a decorator)."""
        self._handlers[name].append(handler)
        return handler

    def off(self, name: str, handler: EventHandler) -> None:
        self._handlers[name].remove(handler)

    def wants(self, name: str) -> bool:
        """True if a handler listens to ``name`` (lets hot paths skip building events)."""
        return bool(self._handlers.get(name))

    def emit(self, name: str, **data: Any) -> None:
        handlers = self._handlers.get(name)
        if not handlers:
            return
        for handler in tuple(handlers):
            try:
                result = handler({"event": name, **data})
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(self._handler_done)
            except Exception:
                logger.exception("handler for event %r failed", name)

    def _handler_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("handler failed", exc_info=task.exception())

    async def aclose(self) -> None:
        """Wait for handlers that are still running."""
        while self._tasks:
            await asyncio.gather(*tuple(self._tasks), return_exceptions=True)
