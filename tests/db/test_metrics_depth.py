"""graphile_worker_queue_depth by task, named queue and state (states that
partition the jobs, as `graphile-worker status` counts them), its retrying
subset, its bounded queue label, and the oldest runnable job's age: scraped
over HTTP, exact values."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from dbhelpers import rows, value
from metrics_scrape import JOBS, Samples, scrape_async, served
from workers import worker

from worker_cli import Helpers
from worker_cli.observe import queue_depth
from worker_cli.observe.status_report import read_status

DEPTH = "graphile_worker_queue_depth"
RETRYING = "graphile_worker_queue_depth_retrying"
OLDEST = "graphile_worker_oldest_runnable_job_age_seconds"


def series(samples: Samples, metric: str) -> dict[tuple[str, ...], float]:
    """One family's samples: label values in their names' order -> value."""
    return {
        tuple(value for _, value in sorted(labels)): got
        for (name, labels), got in samples.items()
        if name == metric
    }


def depth(samples: Samples) -> dict[tuple[str, str, str], float]:
    """(task, queue, state) -> jobs."""
    return {(t, q, s): got for (q, s, t), got in series(samples, DEPTH).items()}


def by_pair(samples: Samples, metric: str) -> dict[tuple[str, str], float]:
    """(task, queue) -> value, of a family labelled queue and task."""
    return {(t, q): got for (q, t), got in series(samples, metric).items()}


def add(db: str, task: str, queue: str | None, n: int = 1, run_at: str = "now()") -> list[int]:
    """``n`` jobs of ``task`` in ``queue``, flagged ``held`` (a worker that
    forbids the flag has them and does not run them); their ids."""
    found = rows(
        db,
        "select (graphile_worker.add_job(%s, queue_name => %s, run_at => "
        + run_at
        + ", flags => array['held'])).id from generate_series(1, %s)",
        [task, queue, n],
    )
    return [r["id"] for r in found]


async def nothing(payload: Any, helpers: Helpers) -> None:
    pass


@pytest.mark.db
async def test_the_states_partition_the_jobs_by_task_and_queue(db: str) -> None:
    """Each job in exactly one state: the depth adds up to the table, per task
    and per named queue to `graphile-worker status`'s figures; the retrying
    gauge counts the retrying jobs (and paused ones that failed before)."""
    a_mail = add(db, "a", "mail", 4)
    a_none = add(db, "a", None, 2)
    b_mail = add(db, "b", "mail", 3, "now() + interval '1 hour'")
    add(db, "b", "sms", 1)
    add(db, "elsewhere", "sms", 2)
    # a/mail: 1 running, 1 failed, 1 retrying (due after a failed attempt),
    # 1 waiting; a/none: 1 retrying (later), 1 waiting; b/mail: 1 failed
    # (scheduled in the future: still failed), 1 retrying (later), 1 scheduled.
    rows(db, f"update {JOBS} set locked_at = now(), locked_by = 'x' where id = %s", [a_mail[0]])
    failed = [a_mail[1], b_mail[0]]
    rows(db, f"update {JOBS} set attempts = max_attempts where id = any(%s)", [failed])
    rows(db, f"update {JOBS} set attempts = 1 where id = any(%s)", [[a_mail[2], b_mail[1]]])
    rows(
        db,
        f"update {JOBS} set attempts = 1, run_at = now() + interval '1 hour' where id = %s",
        [a_none[0]],
    )
    # sms is paused: its jobs are paused, whatever they would be otherwise.
    rows(db, "select 1 from graphile_worker.py_pause('queue', 'sms')")
    tasks = {"a": nothing, "b": nothing, "mine": nothing}
    async with (
        served() as server,
        worker(db, tasks, forbidden_flags=["held"], metrics_registry=server.registry),
    ):
        samples = await scrape_async(server.url)
    status = await read_status(db)
    other = queue_depth.OTHER_TASKS
    expected = {
        ("a", "mail"): {"waiting": 1, "retrying": 1, "running": 1, "failed": 1},
        ("a", ""): {"waiting": 1, "retrying": 1},
        ("b", "mail"): {"scheduled": 1, "retrying": 1, "failed": 1},
        ("b", "sms"): {"paused": 1},
        ("b", ""): {},  # a task of the worker's: there, at 0, with no job
        ("mine", ""): {},
        (other, "sms"): {"paused": 2},
        (other, ""): {},
    }
    assert depth(samples) == {
        (task, queue, state): figures.get(state, 0)
        for (task, queue), figures in expected.items()
        for state in queue_depth.STATES
    }
    assert by_pair(samples, RETRYING) == {
        pair: {("a", "mail"): 1, ("a", ""): 1, ("b", "mail"): 1}.get(pair, 0) for pair in expected
    }
    # A partition: the states add up to every job, once.
    assert sum(depth(samples).values()) == value(db, f"select count(*) from {JOBS}") == 12
    for state in queue_depth.STATES:
        for queue in ("mail", "sms"):
            got = sum(n for (_, q, s), n in depth(samples).items() if (q, s) == (queue, state))
            assert got == getattr(status.queues[queue], state), (queue, state)
        for task in ("a", "b"):
            got = sum(n for (t, _, s), n in depth(samples).items() if (t, s) == (task, state))
            assert got == getattr(status.tasks[task], state), (task, state)
        assert sum(n for (_, _, s), n in depth(samples).items() if s == state) == getattr(
            status.jobs, state
        )
    assert sum(by_pair(samples, RETRYING).values()) == status.jobs.retrying == 3


@pytest.mark.db
async def test_the_named_queues_with_the_most_jobs_have_a_label_the_others_share_one(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QUEUE_LABELS named queues by their jobs (then by name), the others
    under (other), no named queue as "": the series stay bounded."""
    monkeypatch.setattr(queue_depth, "QUEUE_LABELS", 2)
    for queue, n in (("q1", 1), ("q2", 4), ("q3", 2), ("q4", 2), (None, 5)):
        add(db, "mine", queue, n)
    async with (
        served() as server,
        worker(db, {"mine": nothing}, forbidden_flags=["held"], metrics_registry=server.registry),
    ):
        samples = await scrape_async(server.url)
    waiting = {q: n for (_, q, s), n in depth(samples).items() if s == "waiting"}
    # q2 (4 jobs), then q3 (2, before q4 by name); q4 and q1 together.
    assert waiting == {"": 5, "q2": 4, "q3": 2, queue_depth.OTHER_QUEUES: 3}
    # mine's four queue labels, and the other tasks' bucket (always there).
    assert len(series(samples, DEPTH)) == 5 * len(queue_depth.STATES)


@pytest.mark.db
async def test_the_oldest_runnable_job_age_by_task_and_queue(db: str) -> None:
    """Seconds since the run_at of the oldest job due, unlocked, with
    attempts left; 0 where none waits; +Inf for a run_at of -infinity."""
    add(db, "a", "mail", 1, "now() - interval '1 hour'")
    add(db, "a", "mail", 1, "now() - interval '10 minutes'")
    older = [
        *add(db, "a", "mail", 1, "now() - interval '2 hours'"),  # locked
        *add(db, "a", "mail", 1, "now() - interval '3 hours'"),  # permanently failed
    ]
    rows(db, f"update {JOBS} set locked_at = now(), locked_by = 'x' where id = %s", [older[0]])
    rows(db, f"update {JOBS} set attempts = max_attempts where id = %s", [older[1]])
    add(db, "a", None, 1, "now() - interval '30 seconds'")
    add(db, "b", None, 1, "now() + interval '1 hour'")  # scheduled: none waits
    add(db, "b", "sms", 1, "'-infinity'")
    started = time.monotonic()
    tasks = {"a": nothing, "b": nothing}
    async with (
        served() as server,
        worker(db, tasks, forbidden_flags=["held"], metrics_registry=server.registry),
    ):
        samples = await scrape_async(server.url)
    # The jobs were added at most `elapsed` seconds before the query read them.
    elapsed = time.monotonic() - started + 1
    ages = by_pair(samples, OLDEST)
    assert set(ages) == {("a", "mail"), ("a", ""), ("b", ""), ("b", "sms"), ("(other)", "")}
    assert 3600 <= ages[("a", "mail")] < 3600 + elapsed
    assert 30 <= ages[("a", "")] < 30 + elapsed
    assert ages[("b", "")] == 0 and ages[("(other)", "")] == 0
    assert ages[("b", "sms")] == math.inf
