"""The NOTIFY channels of the job lifecycle (migrations/py/000008.sql's
``py_channel``): waiters are told jobs finished, pools that jobs were
cancelled."""

from __future__ import annotations

import hashlib

__all__ = ["channel", "finished_channel"]

#: The longest channel name PostgreSQL takes, in bytes (NAMEDATALEN - 1).
_CHANNEL_BYTES = 63


def channel(schema: str, kind: str) -> str:
    """The NOTIFY channel ``<schema>:py:<kind>`` (``finished``: waiters are told
    jobs finished; ``cancel``: pools are told jobs were cancelled). A schema
    name too long for PostgreSQL's 63 bytes is cut between characters, and a
    hash of the whole name appended (two long names sharing a beginning still
    get two channels). The SQL function ``py_channel(kind)``
    (migrations/py/000008.sql) gives the same name."""
    suffix = f":py:{kind}"
    name = schema + suffix
    if len(name.encode()) <= _CHANNEL_BYTES:
        return name
    digest = hashlib.sha256(schema.encode()).hexdigest()[:8]
    room = _CHANNEL_BYTES - len(suffix) - len(digest) - 1
    cut = schema.encode()[:room].decode(errors="ignore")
    return f"{cut}~{digest}{suffix}"


def finished_channel(schema: str) -> str:
    """The channel of finished jobs (see :func:`channel`)."""
    return channel(schema, "finished")
