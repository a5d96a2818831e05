"""The test project's tasks; each appends what it does to the file JOBS_LOG."""

import asyncio
import os
import threading
import time

from django.tasks import task


def log(*parts: object) -> None:
    path = os.environ.get("JOBS_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(" ".join(map(str, parts)) + f" @{time.time():.3f}\n")


@task
def add(a: int, b: int) -> int:
    log("add", a, b)
    return a + b


@task
def record(name: str, sleep: float = 0.0) -> str:
    log("start", name, os.getpid())
    time.sleep(sleep)
    log("end", name)
    return name


@task(queue_name="emails")
def send_email(to: str) -> None:
    log("email", to)


@task
def fail(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True, max_attempts=2)
def flaky(context, succeed_on: int) -> int:  # type: ignore[no-untyped-def]
    log("flaky", context.attempt)
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True, max_attempts=2)
def hang_first(context, marker: str) -> str:  # type: ignore[no-untyped-def]
    log("hang_first", marker, context.attempt, os.getpid())
    if context.attempt == 1:
        time.sleep(120)
    return f"attempt {context.attempt}"


@task
def hang(marker: str) -> None:
    log("hang", marker, os.getpid())
    time.sleep(120)


@task(takes_context=True)
def with_context(context) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {"id": context.task_result.id, "attempt": context.attempt}


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    log("async_add", a, b, threading.current_thread() is threading.main_thread())
    return a + b


@task
def bad_return() -> object:
    return {1, 2}


def not_a_task(path: str) -> None:
    """A plain function: a job naming it must never call it."""
    with open(path, "w", encoding="utf-8") as file:
        file.write("called")


@task(max_attempts=3)
def gives_up(reason: str) -> None:
    from worker_cli.tasks.retry_policy import Discard

    raise Discard(reason)


@task(takes_context=True)
def started_tzinfo(context) -> str:  # type: ignore[no-untyped-def]
    """The time zone of the running result's start (None: naive, USE_TZ = False)."""
    return str(context.task_result.started_at.tzinfo)


class Unprintable(Exception):
    """An exception whose str() raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


class NotAnException(BaseException):
    """A BaseException that is not an Exception."""


class BadlyNamed(Exception):
    """Its qualified name holds a NUL, its module a lone surrogate: text
    PostgreSQL's jsonb cannot hold as given."""


BadlyNamed.__qualname__ = "Bad\x00Name"
BadlyNamed.__module__ = "jobsapp.tasks\udc80"


@task
def raises(kind: str, size: int = 0) -> None:
    """Raises what ``kind`` names (``size``: a message that long)."""
    log("raises", kind)
    if kind == "system_exit":
        raise SystemExit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt
    if kind == "base":
        raise NotAnException("not an Exception")
    if kind == "unprintable":
        raise Unprintable()
    if kind == "huge":
        raise ValueError("start " + "x" * size + " end")
    raise BadlyNamed("badly named")


@task
async def async_fail(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
def fails_while(context, path: str) -> int:  # type: ignore[no-untyped-def]
    """Fails while the file ``path`` exists; returns the attempt that succeeded."""
    log("fails_while", context.attempt)
    if os.path.exists(path):
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task
def echo(value: object) -> object:
    """Returns its argument (nothing logged: it may be any text)."""
    return value
