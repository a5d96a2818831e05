"""What ``make_worker_utils`` and ``make_sync_worker_utils`` accept as ``connection=``.

A connection given is used exactly as it is: the utilities join its open
transaction and never commit, roll back, close it or change its autocommit
mode (see :mod:`worker_cli.db.drivers`). Anything else gets one
:class:`~worker_cli.errors.ConfigurationError` naming what was expected, with
a hint for the objects people are likely to pass by mistake.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..errors import ConfigurationError

__all__ = ["check_given_connection", "check_given_pool"]


def check_given_connection(
    connection: object,
    *,
    factory: str,
    expected: type[psycopg.Connection[Any]] | type[psycopg.AsyncConnection[Any]],
    pool: object,
    connection_string: str | None,
) -> None:
    """Refuse a ``connection=`` that ``factory`` cannot use as it is."""
    if pool is not None or connection_string is not None:
        other = "pool=" if pool is not None else "a connection string"
        raise ConfigurationError(
            f"{factory}: give connection= alone, not with {other}: the connection given "
            "is used as it is"
        )
    wanted = f"{expected.__module__.partition('.')[0]}.{expected.__name__}"
    if not isinstance(connection, expected):
        raise ConfigurationError(
            f"{factory}(connection=...) expects an open {wanted} (psycopg 3); "
            f"got {_describe(connection)}{_hint(connection, factory)}"
        )
    if connection.closed:
        raise ConfigurationError(
            f"{factory}(connection=...) expects an open {wanted}; this one is closed"
        )


def check_given_pool(pool: object, *, factory: str, expected: type) -> None:
    """Refuse a ``pool=`` of the wrong kind (a sync pool for the async factory...)."""
    if not isinstance(pool, expected):
        raise ConfigurationError(
            f"{factory}(pool=...) expects a psycopg_pool.{expected.__name__}; "
            f"got {_describe(pool)}{_hint(pool, factory)}"
        )


def _describe(value: object) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def _hint(value: object, factory: str) -> str:
    """A hint for the objects passed by mistake most often."""
    module = type(value).__module__
    sync_factory = factory == "make_sync_worker_utils"
    if isinstance(value, psycopg.AsyncConnection) and sync_factory:
        return " (an async connection: use make_worker_utils(connection=...))"
    if isinstance(value, psycopg.Connection) and not sync_factory:
        return " (a sync connection: use make_sync_worker_utils(connection=...))"
    if module.startswith("psycopg_pool"):
        return " (a pool: pass it as pool=, for the factory of its kind)"
    if module.startswith("psycopg2"):
        return (
            " (psycopg2 is not supported: connect with psycopg 3; Django and SQLAlchemy "
            "use it when psycopg is installed, SQLAlchemy with a postgresql+psycopg:// URL)"
        )
    if module.startswith("django"):
        return (
            " (Django's wrapper: pass django.db.connection.connection, the psycopg "
            "connection inside it, after connection.ensure_connection())"
        )
    if module.startswith("sqlalchemy"):
        return (
            " (a SQLAlchemy object: pass its psycopg connection, "
            "session.connection().connection.driver_connection)"
        )
    return ""
