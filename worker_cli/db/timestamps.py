"""Timestamps outside Python's range, read as the earliest or latest datetime.

PostgreSQL's ``timestamptz`` runs from 4713 BC to 294276 AD, plus
``-infinity`` and ``infinity``; a Python ``datetime`` from year 1 to 9999.
``add_job(run_at => '-infinity')`` is accepted, so a job's row may hold any
of them, and psycopg refuses to load such a value (the whole result with it).
The readers of whole tables (the dashboard) register these loaders: a value
before year 1 reads as ``datetime.min`` and one after 9999 as
``datetime.max``, both in UTC. The worker's fetch keeps psycopg's own loaders
(faster) and falls back to the same reading for the rare batch that needs it
(:mod:`worker_cli.worker.pipeline.unreadable`).
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

__all__ = ["EARLIEST", "LATEST", "read_timestamps_leniently"]

#: What a timestamp before year 1 (``-infinity`` included) reads as.
EARLIEST = datetime.min.replace(tzinfo=UTC)
#: What a timestamp after year 9999 (``infinity`` included) reads as.
LATEST = datetime.max.replace(tzinfo=UTC)


class _LenientTimestamptzLoader(TimestamptzLoader):
    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data).decode()
            return EARLIEST if text.startswith("-") or text.endswith("BC") else LATEST


class _LenientTimestamptzBinaryLoader(TimestamptzBinaryLoader):
    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            # Microseconds since 2000-01-01, signed.
            return EARLIEST if int.from_bytes(data, "big", signed=True) < 0 else LATEST


def read_timestamps_leniently(context: AdaptContext) -> None:
    """Make a connection or cursor read out-of-range ``timestamptz`` values as
    :data:`EARLIEST` or :data:`LATEST` (text and binary results)."""
    context.adapters.register_loader("timestamptz", _LenientTimestamptzLoader)
    context.adapters.register_loader("timestamptz", _LenientTimestamptzBinaryLoader)
