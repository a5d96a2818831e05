"""The progress line of ``--once`` (worker_cli.observe.progress), without a
database: a pool that is not running (still starting, or closed and about to
log its total) gets no progress line, whose count of jobs remaining it could
not read; the total still comes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import pytest

from worker_cli.observe.progress import ProgressReporter

pytestmark = pytest.mark.unit


@dataclass
class NotRunning:
    """A pool as observers see it before it runs or after it closed."""

    id: str = "pool-test"
    jobs_done: int = 12
    utils: None = None


async def test_no_progress_line_while_the_pool_is_not_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="graphile_worker.progress")
    reporter = ProgressReporter(NotRunning(), 0.005)  # type: ignore[arg-type]
    reporter.start()
    await asyncio.sleep(0.05)  # ten intervals
    reporter.finish()
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if m.startswith("Progress:")] == []
    assert len([m for m in messages if m.startswith("Done: 12 jobs")]) == 1
