"""How Django queues are named in graphile-worker: task identifiers."""

from __future__ import annotations

__all__ = ["IDENTIFIER_PREFIX", "MAX_QUEUE_NAME", "identifier_of"]

#: Task identifiers are ``django:<queue name>``, at most 128 characters.
IDENTIFIER_PREFIX = "django:"
MAX_QUEUE_NAME = 128 - len(IDENTIFIER_PREFIX)


def identifier_of(queue_name: str) -> str:
    """The graphile-worker task identifier of a Django queue: its jobs run in
    parallel (a Django queue is a routing label, not a serial named queue)."""
    return IDENTIFIER_PREFIX + queue_name
