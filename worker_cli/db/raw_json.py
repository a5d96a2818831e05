"""``json`` values loaded as their text, unparsed: a batch of job rows then
parses every payload with one ``json.loads`` (see
:func:`~worker_cli.jobs.job.parse_payloads`)."""

from __future__ import annotations

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

__all__ = ["RawPayloadBinaryLoader", "RawPayloadLoader", "read_payloads_raw"]


class RawPayloadLoader(Loader):
    """Loads a ``json`` value as its text, unparsed (bytes).

    Jobs come in batches: :func:`parse_payloads` then reads every payload of
    a batch with one ``json.loads``, about five times faster than one call
    per row. PostgreSQL has already checked that each value is JSON.
    """

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


class RawPayloadBinaryLoader(RawPayloadLoader):
    """:class:`RawPayloadLoader` for results in binary format (``json`` is sent
    as its text in both formats)."""

    format = Format.BINARY


def read_payloads_raw(context: AdaptContext) -> None:
    """Make a connection or cursor load ``json`` columns with :class:`RawPayloadLoader`
    (in text and binary results)."""
    context.adapters.register_loader("json", RawPayloadLoader)
    context.adapters.register_loader("json", RawPayloadBinaryLoader)
