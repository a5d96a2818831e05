"""Finished Django task results are deleted ``keep_results_days`` after they
finished: a cron item of every ``manage.py graphile_worker`` (hourly, at
minute 17; cron runs it once across all workers), in batches of 1,000 rows.
READY and RUNNING results are never pruned."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from ...jobs.crontab import ParsedCronItem, parse_crontab
from ...sql import compose
from ...sql import django as django_sql
from ...tasks.helpers import Helpers

__all__ = ["PRUNE_TASK", "make_prune_task", "prune_cron_items"]

#: The task identifier of the pruning (not a Django queue's: no ``django:``).
PRUNE_TASK = "py:django_prune_results"
#: The most batches one run deletes (the next run goes on).
MAX_BATCHES = 100


def prune_cron_items(keep_days: float | None) -> list[ParsedCronItem]:
    """The hourly pruning item (none when results are kept for ever)."""
    if keep_days is None:
        return []
    return parse_crontab(f"17 * * * * {PRUNE_TASK} ?max=1 {{seconds: {keep_days * 86400:g}}}")


def make_prune_task(schema: str) -> Callable[[Any, Helpers], Coroutine[Any, Any, int]]:
    """The pruning task: deletes results finished more than
    ``payload["seconds"]`` ago; returns how many."""

    async def prune_django_results(payload: Any, helpers: Helpers) -> int:
        seconds = float(payload["seconds"])
        deleted = 0
        async with helpers.with_pg_client() as conn:
            for _ in range(MAX_BATCHES):
                cursor = await conn.execute(compose(django_sql.PRUNE, schema), [seconds])
                deleted += cursor.rowcount
                if cursor.rowcount < 1000:
                    break
        return deleted

    return prune_django_results
