"""The expiry ledger (migrations/py/000011.sql): how the pruning finds the
history rows that expired without an index on the history but its primary
key. Each statement that records jobs in the history lists them in the
ledger too, in the same statement: one ledger row per batch (at most 1,000
ids), indexed by when its rows expire."""

from __future__ import annotations

from typing import LiteralString

__all__ = ["expiry_ledger"]


def expiry_ledger(source: LiteralString) -> LiteralString:
    """A CTE ``expiry`` listing the history rows just recorded by ``source`` (a
    CTE returning their ``job_id`` and ``expires_at``) in the expiry ledger
    (migrations/py/000011.sql), 1,000 ids a ledger row at most, through which
    the pruning finds them. Nothing when ``source`` recorded nothing."""
    return (
        """
  expiry as (
    insert into {schema}._private_py_job_history_expiry (expires_at, job_ids)
    select min(r.expires_at), array_agg(r.job_id)
    from (select s.job_id, s.expires_at, (row_number() over () - 1) / 1000 as chunk
          from """
        + source
        + """ as s) as r
    group by r.chunk
  )"""
    )
