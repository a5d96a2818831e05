"""Events a running worker emits, named as graphile-worker's (``job:success``, ...)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["EventHandler", "Events"]

logger = logging.getLogger("graphile_worker.events")

EventHandler = Callable[[dict[str, Any]], Any]


class Events:
    """A small event emitter: ``events.on("job:success", handler)``.

    Handlers receive one dict (``{"job": ..., "worker_id": ...}``). A handler
    may be a coroutine function; its coroutine runs as a task this emitter
    owns, and :meth:`aclose` waits for those still running. A handler that
    raises (anything, ``SystemExit`` included), sync or async, is logged and
    ignored: it never breaks the worker.
    """

    def __init__(self) -> None:
        self._handlers: defaultdict[str, list[EventHandler]] = defaultdict(list)
        self._tasks: set[asyncio.Task[None]] = set()

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
        """Call the handlers of ``name``; never raises. Whatever a handler
        raises is logged, a ``CancelledError`` too: nothing is awaited here, so
        it is never a cancellation of the caller's own."""
        handlers = self._handlers.get(name)
        if not handlers:
            return
        for handler in tuple(handlers):
            try:
                result = handler({"event": name, **data})
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(_contained(name, result))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            except BaseException:
                with contextlib.suppress(BaseException):  # a user's logging filter may raise
                    logger.exception("A handler of the event %r raised; ignored", name)

    async def aclose(self, within: float | None = None) -> None:
        """Wait for the async handlers still running (those started meanwhile too);
        after ``within`` seconds, cancel the rest."""
        try:
            async with asyncio.timeout(within):
                while self._tasks:
                    await asyncio.wait(tuple(self._tasks))
        except TimeoutError:
            logger.warning(
                "%d async event handler(s) still running after %gs; cancelled",
                len(self._tasks),
                within,
            )
            for task in tuple(self._tasks):
                task.cancel()
            if self._tasks:  # one that swallows its cancellation is left behind
                await asyncio.wait(tuple(self._tasks), timeout=1)


async def _contained(name: str, awaitable: Awaitable[Any]) -> None:
    """An async handler's run: whatever it raises is logged, not propagated
    (``SystemExit`` would otherwise stop the event loop)."""
    try:
        await awaitable
    except asyncio.CancelledError:
        raise
    except BaseException:
        logger.exception("An async handler of the event %r raised; ignored", name)
