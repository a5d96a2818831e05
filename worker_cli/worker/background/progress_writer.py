"""The progress writer: writes what tasks report with ``helpers.progress``.

A task may call ``helpers.progress`` as often as it likes, from the loop or
from a plain task's thread: :meth:`ProgressWriter.report` only records the
job's latest report (a dict assignment). Every :data:`INTERVAL` seconds the
writer's loop writes the reports made since its last write, each job's
latest, in one statement (``_private_py_job_progress``): at most a few writes
a second per job, whatever the tasks do, and nothing on the completion's
path. A report made just before its job ends is written after it (the row
outlives the job: it is its history's progress). A write the database fails is
logged and dropped (the next report replaces it): progress is information,
never a job's outcome. One the database refuses for what a report holds (a
user's trigger) is written again job by job: only that job's is dropped.
When the pool stops, what is left is written once more, briefly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from ...sql import compose
from ...sql import job_progress as progress_sql
from ...tasks.helpers import MESSAGE_MAX
from ..pipeline.result_writer import refused

__all__ = ["INTERVAL", "ProgressWriter"]

logger = logging.getLogger("graphile_worker")

#: Seconds between two writes (a job's progress is written at most this often).
INTERVAL = 0.5
#: Seconds the last write may take when the pool stops.
LAST_WRITE = 2.0

Report = tuple[float, float | None, str | None]


class ProgressWriter:
    """Records the jobs' latest progress reports and writes them (see the
    module's docstring); :meth:`run` is its loop (cancel it to stop)."""

    def __init__(self, db: AsyncConnectionPool[Any], *, schema: str) -> None:
        self._db = db
        self._statement = compose(progress_sql.WRITE_PROGRESS, schema)
        #: Job id -> its latest report not written yet (under _lock: plain
        #: tasks report from their threads).
        self._pending: dict[int, Report] = {}
        self._lock = threading.Lock()
        #: Rows written (for tests and the curious).
        self.written = 0

    def report(self, job_id: int, done: float, total: float | None, message: str | None) -> None:
        """Keep a job's latest progress (any thread; never waits)."""
        with self._lock:
            self._pending[job_id] = (done, total, message)

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(INTERVAL)
                if self._pending:
                    await self.write()
        except asyncio.CancelledError:
            if self._pending:
                try:
                    async with asyncio.timeout(LAST_WRITE):
                        await self.write()
                except (TimeoutError, asyncio.CancelledError):
                    pass
            raise

    async def write(self) -> None:
        """Write the pending reports, in one statement; never raises but
        CancelledError (a failure is logged; those reports are dropped)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        try:
            await self._write(pending)
        except (psycopg.Error, OSError) as exc:
            if not refused(exc) or len(pending) == 1:
                logger.warning("Writing the progress of %d job(s) failed: %s", len(pending), exc)
                return
            # Refused for what one report holds (a user's trigger, say):
            # each job's alone, so that the others are written.
            for job_id, report in pending.items():
                try:
                    await self._write({job_id: report})
                except (psycopg.Error, OSError) as exc:
                    logger.warning("Writing the progress of job %d failed: %s", job_id, exc)

    async def _write(self, pending: dict[int, Report]) -> None:
        ids = list(pending)
        reports = [pending[i] for i in ids]
        async with self._db.connection() as conn:
            await conn.execute(
                self._statement,
                {
                    "job_ids": ids,
                    "dones": [float(r[0]) for r in reports],
                    "totals": [None if r[1] is None else float(r[1]) for r in reports],
                    "messages": [_storable(r[2]) for r in reports],
                },
            )
        self.written += len(ids)


def _storable(message: str | None) -> str | None:
    """A progress message as stored: its first :data:`MESSAGE_MAX`
    characters, NUL and lone surrogates escaped."""
    if message is None:
        return None
    cut = str(message)[:MESSAGE_MAX]
    return cut.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
