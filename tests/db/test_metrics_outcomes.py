"""graphile_worker_jobs_total's outcomes, scraped over HTTP: each attempt
exactly one of success, retry (another attempt follows) and the final
failures (failure, cancelled, timeout)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from metrics_scrape import Samples, sample, scrape_async, served
from workers import worker

from worker_cli import Cancel, Discard, Helpers, WorkerUtils, task_options
from worker_cli.observe.job_stats import OUTCOMES


def outcomes(samples: Samples) -> dict[tuple[str, str], float]:
    """The jobs_total series that are not 0: (task, outcome) -> count."""
    return {
        (labels["task"], labels["outcome"]): count
        for (name, label_set), count in samples.items()
        if name == "graphile_worker_jobs_total" and count
        for labels in [dict(label_set)]
    }


@pytest.mark.db
async def test_each_attempt_is_one_outcome_and_final_failures_are_apart(
    utils: WorkerUtils, db: str
) -> None:
    started = asyncio.Event()

    async def ok(payload: Any, helpers: Helpers) -> None:
        pass

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise ValueError("flaky")

    async def discard(payload: Any, helpers: Helpers) -> None:
        raise Discard("not wanted")

    async def cancel(payload: Any, helpers: Helpers) -> None:
        raise Cancel("by its task")

    async def waits(payload: Any, helpers: Helpers) -> None:
        started.set()
        await asyncio.sleep(60)

    @task_options(timeout=0.1, on_timeout="fail")
    async def slow(payload: Any, helpers: Helpers) -> None:
        await asyncio.sleep(60)

    @task_options(timeout=0.1, on_timeout="retry")
    async def slow_retry(payload: Any, helpers: Helpers) -> None:
        await asyncio.sleep(60)

    tasks = {
        "ok": ok,
        "flaky": flaky,
        "discard": discard,
        "cancel": cancel,
        "waits": waits,
        "slow": slow,
        "slow_retry": slow_retry,
    }
    expected = {
        ("ok", "success"): 2,
        ("flaky", "retry"): 2,  # attempts left: each retried later
        ("flaky", "failure"): 1,  # its last attempt
        ("discard", "failure"): 1,  # Discard ends it, attempts left or not
        ("cancel", "cancelled"): 1,  # the task raised Cancel
        ("waits", "cancelled"): 1,  # cancel_job while it ran
        ("slow", "timeout"): 1,  # on_timeout="fail"
        ("slow_retry", "retry"): 1,  # on_timeout="retry", attempts left
    }
    async with (
        served() as server,
        worker(db, tasks, concurrency=10, metrics_registry=server.registry),
    ):
        await utils.add_jobs([{"identifier": "ok"}] * 2)
        await utils.add_jobs([{"identifier": "flaky", "max_attempts": 3}] * 2)
        await utils.add_job("flaky", max_attempts=1)
        await utils.add_jobs(
            [{"identifier": name} for name in ("discard", "cancel", "slow", "slow_retry")]
        )
        waiting = await utils.add_job("waits")
        await started.wait()
        await utils.cancel_job(waiting.id)
        deadline = time.monotonic() + 20
        while True:
            samples = await scrape_async(server.url)
            if sum(outcomes(samples).values()) >= sum(expected.values()):
                break
            assert time.monotonic() < deadline, outcomes(samples)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # nothing more comes
        samples = await scrape_async(server.url)
    assert outcomes(samples) == expected
    for task in tasks:  # every outcome of every task has its series, at 0 or more
        total = sum(
            sample(samples, "graphile_worker_jobs_total", task=task, outcome=outcome)
            for outcome in OUTCOMES
        )
        # Each attempt in the histogram once, whatever its outcome.
        assert sample(samples, "graphile_worker_job_duration_seconds_count", task=task) == total
