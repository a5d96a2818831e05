"""Tasks: what runs a job, and loading them from a ``tasks/`` folder.

A task is a callable ``task(payload, helpers)``. Coroutine functions are
awaited; plain functions run in a worker thread so they cannot block the event
loop. In a folder, ``users/send_email.py`` defines the task
``users/send_email`` through its module-level ``task`` callable, and an
executable file without ``.py`` is a task run as a subprocess, the way
graphile-worker (Node) runs executable tasks.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from ..errors import TaskLoadError
from .task_options import DEFAULT_TASK_OPTIONS, TaskOptions, options_of
from .typed_tasks import typed_task

if TYPE_CHECKING:
    from .helpers import Helpers

__all__ = [
    "Task",
    "TaskFunction",
    "TaskLoadError",
    "TaskLocation",
    "load_located",
    "load_task_directory",
    "make_task_list",
]

TaskFunction: TypeAlias = Callable[[Any, "Helpers"], Any]

_NAME = re.compile(r"[A-Za-z0-9_-]+")


class TaskLocation(NamedTuple):
    """Where a worker's child process loads a ``process=True`` task from:
    ``("file", path, "task")`` (a task file) or ``("module", module, qualname)``."""

    kind: str
    where: str
    name: str


@dataclass(frozen=True)
class Task:
    """A loaded task: its identifier, the callable, how to call it, and its
    settings (declared with :func:`~worker_cli.tasks.task_options.task_options`).

    A ``process=True`` task is an ``async def`` here: it hands its jobs to the
    worker's processes (``helpers`` knows them), which load it from
    :attr:`location`."""

    identifier: str
    function: TaskFunction
    is_async: bool
    source: str
    options: TaskOptions = DEFAULT_TASK_OPTIONS
    location: TaskLocation | None = None

    @classmethod
    def from_function(
        cls,
        identifier: str,
        function: TaskFunction,
        source: str,
        *,
        label: str | None = None,
        path: Path | None = None,
    ) -> Task:
        """The task running ``function``: a function whose payload parameter is
        annotated with a type gets that type (see :mod:`.typed_tasks`). Errors
        name the task by ``label`` (default: ``source``). Its options are those
        declared on ``function`` (``@task_options``); ``path``: the task file
        it comes from."""
        is_async = _is_async(function)
        label = label or source
        typed = typed_task(identifier, function, is_async, label)
        options = options_of(function)
        if not options.process:
            return cls(identifier, typed, is_async, source, options)
        if is_async:
            raise TaskLoadError(
                f"{label}: process=True is for plain def tasks; this one is async def "
                "(it already leaves the event loop free: drop process=True)"
            )
        location = _location_of(function, label, path)
        return cls(identifier, _in_process(identifier, typed), True, source, options, location)


def _location_of(function: TaskFunction, label: str, path: Path | None) -> TaskLocation:
    """Where a child process finds a ``process=True`` task (TaskLoadError if nowhere)."""
    if path is not None:
        return TaskLocation("file", str(path.resolve()), "task")
    module = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None)
    found: Any = sys.modules.get(module) if isinstance(module, str) else None
    for part in (qualname or "<locals>").split("."):
        found = getattr(found, part, None) if part != "<locals>" else None
    if found is not function or not isinstance(module, str) or not isinstance(qualname, str):
        raise TaskLoadError(
            f"{label}: process=True needs a function the worker's processes can import by "
            f"name (defined at the top level of a module), not {function!r}"
        )
    return TaskLocation("module", module, qualname)


def _in_process(identifier: str, function: TaskFunction) -> TaskFunction:
    """A ``process=True`` task as the event loop runs it: its job goes to the
    worker's processes; where there are none (``worker_cli.testing``), it
    runs in a thread."""

    async def run_in_process(payload: Any, helpers: Helpers) -> Any:
        runner = helpers.processes
        if runner is None:
            context = contextvars.Context()
            return await asyncio.to_thread(context.run, function, payload, helpers)
        return await runner(identifier, payload, helpers)

    return run_in_process


def load_located(identifier: str, location: TaskLocation, source: str) -> TaskFunction:
    """In a worker's child process: the function of a ``process=True`` task
    (its payload typed as in the worker); TaskLoadError if it cannot be loaded."""
    if location.kind == "file":
        module = _import_task_file(identifier, Path(location.where), source)
        found: Any = getattr(module, location.name, None)
    else:
        try:
            found = importlib.import_module(location.where)
        except BaseException as exc:
            detail = f"module {location.where!r} failed to import: {exc!r}"
            raise TaskLoadError(f"{source}: {detail}") from exc
        for part in location.name.split("."):
            found = getattr(found, part, None)
    if not callable(found):
        raise TaskLoadError(f"{source}: {location.name!r} is not a function of {location.where!r}")
    return typed_task(identifier, found, False, source)


def _is_async(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004  (an object with async __call__)
    return call is not None and inspect.iscoroutinefunction(call)


def make_task_list(tasks: Mapping[str, TaskFunction]) -> dict[str, Task]:
    """Check a ``task_list`` given to the library and wrap its callables."""
    result: dict[str, Task] = {}
    for identifier, function in tasks.items():
        if not isinstance(identifier, str) or not identifier or len(identifier) > 128:
            raise TaskLoadError(f"task_list: {identifier!r} is not a valid task identifier")
        if not callable(function):
            raise TaskLoadError(f"task_list[{identifier!r}] is not callable")
        result[identifier] = Task.from_function(identifier, function, f"task_list[{identifier!r}]")
    return result


def load_task_directory(directory: Path) -> dict[str, Task]:
    """Load every task under ``directory``; raise TaskLoadError on the first bad file."""
    if not directory.is_dir():
        raise TaskLoadError(f"tasks folder {str(directory)!r} does not exist")
    tasks: dict[str, Task] = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part.startswith((".", "__")) for part in relative.parts):
            continue  # hidden files, __pycache__, __init__.py
        if path.is_dir():
            continue
        if path.suffix == ".py":
            parts = (*relative.parts[:-1], path.stem)
            loader = _load_python_task
        elif os.access(path, os.X_OK) and not path.suffix:
            parts = relative.parts
            loader = _executable_task
        else:
            continue  # data files, READMEs, ...
        bad = [part for part in parts if not _NAME.fullmatch(part)]
        if bad:
            raise TaskLoadError(
                f"task file {str(relative)!r}: {bad[0]!r} may only contain the letters "
                "A-Z and a-z, digits, '_' and '-'"
            )
        identifier = "/".join(parts)
        if len(identifier) > 128:
            raise TaskLoadError(
                f"task file {str(relative)!r}: the identifier is over 128 characters"
            )
        if identifier in tasks:
            raise TaskLoadError(
                f"task file {str(relative)!r}: task {identifier!r} is already defined by "
                f"{tasks[identifier].source!r}"
            )
        tasks[identifier] = loader(identifier, path, str(relative))
    if not tasks:
        raise TaskLoadError(
            f"tasks folder {str(directory)!r} has no tasks (a .py file with a `task` function, "
            "or an executable file)"
        )
    return tasks


def _load_python_task(identifier: str, path: Path, source: str) -> Task:
    module = _import_task_file(identifier, path, source)
    function = getattr(module, "task", None)
    if not callable(function):
        raise TaskLoadError(
            f"task file {source!r} has no callable `task`; define "
            "`async def task(payload, helpers): ...` (or a plain def)"
        )
    return Task.from_function(
        identifier, function, source, label=f"task file {source!r}", path=path
    )


def _import_task_file(identifier: str, path: Path, source: str) -> Any:
    module_name = "graphile_worker_tasks." + identifier.replace("/", ".").replace("-", "_")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TaskLoadError(f"task file {source!r} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        detail = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else repr(exc)
        raise TaskLoadError(f"task file {source!r} failed to import: {detail}") from exc
    return module


def _executable_task(identifier: str, path: Path, source: str) -> Task:
    async def run_executable(payload: Any, helpers: Helpers) -> None:
        job = helpers.job
        env = {
            **os.environ,
            "GRAPHILE_WORKER_PAYLOAD_FORMAT": "json",
            "GRAPHILE_WORKER_TASK_IDENTIFIER": identifier,
            "GRAPHILE_WORKER_JOB_ID": str(job.id),
            "GRAPHILE_WORKER_JOB_ATTEMPTS": str(job.attempts),
            "GRAPHILE_WORKER_JOB_MAX_ATTEMPTS": str(job.max_attempts),
            "GRAPHILE_WORKER_JOB_PRIORITY": str(job.priority),
            "GRAPHILE_WORKER_JOB_RUN_AT": job.run_at.isoformat(),
        }
        if job.key is not None:
            env["GRAPHILE_WORKER_JOB_KEY"] = job.key
        process = await asyncio.create_subprocess_exec(
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert process.stdin and process.stdout and process.stderr

        async def relay(stream: asyncio.StreamReader, log: Callable[[str], None]) -> None:
            async for line in stream:
                log(line.decode(errors="replace").rstrip("\n"))

        async def feed() -> None:
            assert process.stdin
            try:
                process.stdin.write(json.dumps({"payload": payload}).encode())
                await process.stdin.drain()
                process.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the program did not read its input

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(feed())
                group.create_task(relay(process.stdout, helpers.logger.info))
                group.create_task(relay(process.stderr, helpers.logger.error))
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if code != 0:
            raise RuntimeError(f"executable task {source!r} exited with code {code}")

    return Task(identifier, run_executable, True, source)
