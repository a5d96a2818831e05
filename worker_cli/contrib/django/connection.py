"""The worker's connection string, from a Django database alias's settings."""

from __future__ import annotations

from django.db import connections
from psycopg.conninfo import make_conninfo

from ...errors import ConfigurationError

__all__ = ["conninfo_of"]

#: Keys of Django's connection parameters that are not libpq's.
_NOT_LIBPQ = frozenset({"cursor_factory", "context", "prepare_threshold"})


def conninfo_of(alias: str) -> str:
    """A libpq connection string with the settings Django connects ``alias``
    with (NAME, USER, PASSWORD, HOST, PORT and libpq OPTIONS such as sslmode)."""
    if alias not in connections:
        raise ConfigurationError(f"database {alias!r} is not in DATABASES")
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ConfigurationError(
            f"database {alias!r} is {connection.vendor}: graphile-worker needs PostgreSQL"
        )
    params = connection.get_connection_params()
    kept = {
        key: value
        for key, value in params.items()
        if key not in _NOT_LIBPQ and isinstance(value, str | int) and not isinstance(value, bool)
    }
    return make_conninfo("", **kept)
