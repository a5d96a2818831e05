"""Concurrency and rate limits across every Python worker (README,
"Concurrency and rate limits"): at most N running at once, at most N starts
in any window of the period, per payload field value if asked; a denied job
spends no attempt and holds up no other; limits live in the database."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import admin_cli, cli_path, rows, run_cli, value
from worker_fleet import start, stop, wait_for
from workers import until, worker

from worker_cli import (
    Helpers,
    Job,
    JobSpecError,
    Limit,
    WorkerUtils,
    make_sync_worker_utils,
    run_once,
    task_options,
)
from worker_cli.db.raw_json import read_payloads_raw
from worker_cli.jobs.job import jobs_from_rows
from worker_cli.worker.supervision.start_deadlines import START_WITHIN, ClockBound, StartDeadlines

TASKS = "array(select id from graphile_worker._private_tasks)"
FETCH_LIMITED = (
    f"select id from graphile_worker.py_fetch_limited_jobs({TASKS}, null, %s, %s) order by id"
)
FETCH = f"select id from graphile_worker.py_fetch_jobs({TASKS}, null, 100, 'p') order by id"


def fetched(db: str, limit: int = 100, pool: str = "p") -> list[int]:
    """The ids a limited fetch of up to ``limit`` jobs by ``pool`` takes."""
    return [row["id"] for row in rows(db, FETCH_LIMITED, (limit, pool))]


def finish(db: str, ids: list[int]) -> None:
    """The jobs end (their rows go, as a completion does)."""
    rows(db, "delete from graphile_worker._private_jobs where id = any(%s)", (ids,))


# --- Unit ---------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "max_running"),
        ({"max_running": 0}, "max_running"),
        ({"max_running": 10_001}, "max_running"),
        ({"max_running": 2.5}, "max_running"),
        ({"max_starts": 5}, "per"),
        ({"max_running": 1, "per": 1}, "per"),
        ({"max_starts": 5, "per": 0}, "per"),
        ({"max_starts": 5, "per": timedelta(days=2)}, "per"),
        ({"max_starts": 5, "per": "1s"}, "per"),
        ({"max_starts": 0, "per": 1}, "max_starts"),
        ({"max_running": 1, "partition_by": ""}, "partition_by"),
    ],
)
def test_a_bad_limit_names_its_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        Limit(**kwargs)
    assert caught.value.field == field


@pytest.mark.unit
def test_a_limit_keeps_its_period_as_a_timedelta() -> None:
    assert Limit(max_starts=5, per=1.5).per == timedelta(seconds=1.5)
    assert Limit(max_starts=5, per=2) == Limit(max_starts=5, per=timedelta(seconds=2))


# --- The database ---------------------------------------------------------------


@pytest.mark.db
async def test_set_list_remove_async_sync_and_sql(utils: WorkerUtils, db: str) -> None:
    info = await utils.set_limit(Limit(max_running=3, max_starts=50, per=1), task="charge")
    assert (info.kind, info.name, info.limit) == ("task", "charge", Limit(3, 50, 1))
    assert (info.running, info.recent_starts, info.partitions) == (0, 0, 0)
    with make_sync_worker_utils(connection_string=db) as sync:
        sync.set_limit(Limit(max_running=1, partition_by="account_id"), queue="mail")
        assert [(i.kind, i.name) for i in sync.list_limits()] == [
            ("queue", "mail"),
            ("task", "charge"),
        ]
        assert sync.remove_limit(queue="mail") is True
        assert sync.remove_limit(queue="mail") is False
    rows(db, "select graphile_worker.py_set_limit('task', 'report', max_running => 2)")
    assert [(i.name, i.limit) for i in await utils.list_limits()] == [
        ("charge", Limit(3, 50, 1)),
        ("report", Limit(max_running=2)),
    ]
    with pytest.raises(JobSpecError, match="task: a limit names one task, queue or operation, not"):
        await utils.set_limit(Limit(max_running=1), task="*")


@pytest.mark.db
async def test_at_most_n_run_at_once_and_a_denied_job_spends_no_attempt(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_running=2), task="lim")
    added = [j.id for j in await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 5)]
    free = (await utils.add_job("free", {})).id
    # The usual fetch leaves limited tasks to the limited one.
    assert [row["id"] for row in rows(db, FETCH)] == [free]
    first = fetched(db)
    assert first == added[:2]
    assert fetched(db) == []  # full: nothing, however often asked
    attempts = (
        "select id, attempts from graphile_worker._private_jobs where id = any(%s) order by id"
    )
    assert [r["attempts"] for r in rows(db, attempts, (added[2:],))] == [0, 0, 0]
    finish(db, first[:1])
    assert fetched(db) == added[2:3]
    # A job given back (unlocked) frees its slot too.
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = null, locked_by = null, "
        "attempts = attempts - 1 where id = %s",
        (first[1],),
    )
    assert fetched(db) == [first[1]]
    info = (await utils.list_limits())[0]
    assert (info.running, info.partitions) == (2, 1)


@pytest.mark.db
async def test_at_most_n_start_in_any_window_of_the_period(utils: WorkerUtils, db: str) -> None:
    await utils.set_limit(Limit(max_starts=3, per=1), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 8)
    first = fetched(db, 10)
    assert len(first) == 3
    finish(db, first)  # finished at once: the starts still count
    assert fetched(db) == []
    # The next start is allowed a period (and the 50 ms margin) after the
    # first of the three (the database's times: however long this test waits).
    wait = value(
        db,
        f"select graphile_worker.py_limits_next_start({TASKS}) - (select min(x) "
        "from graphile_worker._private_py_limit_state, unnest(starts) as x)",
    )
    assert timedelta(seconds=1) <= wait <= timedelta(seconds=1.05)
    # A period (and the 50 ms margin) later, 3 more: the recorded starts are
    # moved back instead of sleeping.
    rows(
        db,
        "update graphile_worker._private_py_limit_state "
        "set starts = array(select x - interval '1.1 seconds' from unnest(starts) as x)",
    )
    second = fetched(db, 10)
    assert len(second) == 3
    assert (await utils.list_limits())[0].recent_starts == 3


@pytest.mark.db
async def test_each_partition_has_its_own_limit_and_a_full_one_holds_up_no_other(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_running=1, partition_by="account"), task="lim")
    jobs = [{"identifier": "lim", "payload": {"account": a}} for a in ["a", "a", "a", "b", "b"]]
    jobs.append({"identifier": "lim", "payload": {}})  # no field: the '' partition
    ids = [j.id for j in await utils.add_jobs(jobs)]
    assert fetched(db) == [ids[0], ids[3], ids[5]]
    assert fetched(db) == []
    finish(db, [ids[0]])
    assert fetched(db) == [ids[1]]


@pytest.mark.db
async def test_a_queue_limit_counts_every_task_of_the_queue(utils: WorkerUtils, db: str) -> None:
    await utils.set_limit(Limit(max_running=2), queue="mail")
    ids = [
        j.id
        for j in await utils.add_jobs(
            [
                {"identifier": task, "payload": {}, "queue_name": "mail"}
                for task in ["a", "b", "a", "b"]
            ]
        )
    ]
    # A named queue runs one job at a time anyway; its lock is taken too.
    assert fetched(db) == ids[:1]
    assert fetched(db) == []
    assert value(db, "select locked_by from graphile_worker._private_job_queues") == "p"


@pytest.mark.db
def test_the_cli_sets_lists_and_removes_limits_with_one_line_for_bad_input(db: str) -> None:
    done = run_cli(
        "limit", "-c", db, "--task", "charge", "--max-running", "3", "--max-starts", "50",
        "--per", "1s", "--partition-by", "account_id",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "Limited task charge: at most 3 running (0 now), at most 50 starts per 1s "
        "(0 in the last 1s), per value of payload field 'account_id' (0 seen)\n"
    )
    assert admin_cli("limits", "-c", db).stdout.startswith("task charge: at most 3 running")
    [as_json] = json.loads(admin_cli("limits", "-c", db, "--json").stdout)
    assert {k: v for k, v in as_json.items() if k != "updated_at"} == {
        "kind": "task", "name": "charge", "max_running": 3, "max_starts": 50,
        "per_seconds": 1.0, "partition_by": "account_id", "running": 0,
        "recent_starts": 0, "partitions": 0,
    }  # fmt: skip
    for args, message in [
        ((), "give one of --queue NAME, --task IDENTIFIER, --operation NAME"),
        (("--task", "a", "--operation", "b", "--max-running", "1"), "give one of"),
        (("--operation", "b", "--max-running", "1", "--partition-by", "x"), "helpers.limit"),
        (("--task", "a"), "--max-running: give max_running, max_starts (with per), or both"),
        (("--task", "a", "--max-starts", "5"), "--per: max_starts and per go together"),
        (("--task", "a", "--max-starts", "5", "--per", "2d"), "at most a day"),
        (("--task", "a", "--max-running", "0"), "0 is not in the range"),
        (("--task", "a", "--remove", "--max-running", "1"), "--remove takes no other"),
        (
            ("--task", "*", "--max-running", "1"),
            "a limit names one task, queue or operation, not '*'",
        ),
    ]:
        failed = admin_cli("limit", "-c", db, *args)
        assert failed.returncode == 2, (args, failed.stdout)
        assert message in failed.stderr, (args, failed.stderr)
        assert "Traceback" not in failed.stderr
    removed = admin_cli("limit", "-c", db, "--task", "charge", "--remove")
    assert removed.stdout == "Removed the limit of task charge\n"
    # No worker declared one for it: nothing more to say (test_declared_limits.py).
    assert removed.stderr == ""
    assert admin_cli("limits", "-c", db).stdout == "Nothing is limited\n"
    assert json.loads(admin_cli("limits", "-c", db, "--json").stdout) == []


@pytest.mark.db
async def test_a_queue_limit_does_not_count_jobs_without_a_queue(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_running=1), queue="mail")
    await utils.set_limit(Limit(max_running=2), task="charge")
    charge = (await utils.add_job("charge", {})).id
    mail = (await utils.add_job("send", {}, queue_name="mail")).id
    assert fetched(db) == [charge, mail]
    states = "select kind, name, running from graphile_worker._private_py_limit_state order by 1"
    assert [tuple(r.values()) for r in rows(db, states)] == [
        ("queue", "mail", [mail]),
        ("task", "charge", [charge]),
    ]


# --- Workers --------------------------------------------------------------------


@pytest.mark.db
async def test_a_declared_limit_is_stored_and_held_by_the_worker(
    utils: WorkerUtils, db: str
) -> None:
    running = peak = 0

    @task_options(limit=Limit(max_running=2))
    async def lim(payload: Any, helpers: Helpers) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    ran: list[int] = []

    async def free(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)

    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 20)
    await utils.add_jobs([{"identifier": "free", "payload": {}}] * 20)
    await run_once(db, task_list={"lim": lim, "free": free}, concurrency=8, no_handle_signals=True)
    assert peak == 2
    assert len(ran) == 20
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert [(i.name, i.limit) for i in await utils.list_limits()] == [("lim", Limit(2))]


@pytest.mark.db
async def test_once_waits_for_a_full_rate_limit_instead_of_exiting(
    utils: WorkerUtils, db: str
) -> None:
    starts: list[float] = []

    async def lim(payload: Any, helpers: Helpers) -> None:
        starts.append(time.monotonic())

    await utils.set_limit(Limit(max_starts=4, per=0.5), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 10)
    await run_once(db, task_list={"lim": lim}, concurrency=10, no_handle_signals=True)
    assert len(starts) == 10
    assert starts[-1] - starts[0] >= 1.0  # three windows of 0.5 s


class Held:
    """An async task whose jobs wait for :attr:`release`, counting how many
    run at once (:attr:`running`) and the most that did (:attr:`peak`)."""

    def __init__(self) -> None:
        self.running = self.peak = 0
        self.release = asyncio.Event()

    async def task(self, payload: Any, helpers: Helpers) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await self.release.wait()
        self.running -= 1


@pytest.mark.db
async def test_a_limit_set_while_the_worker_runs_applies_at_once(
    utils: WorkerUtils, db: str
) -> None:
    held = Held()
    others: list[int] = []

    async def other(payload: Any, helpers: Helpers) -> None:
        others.append(helpers.job.id)

    async with worker(db, {"lim": held.task, "other": other}, concurrency=10):
        await utils.set_limit(Limit(max_running=2), task="lim")
        await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 6)
        await until(lambda: held.running == 2, what="two limited jobs to start")
        # A fetch after those two: it meets the four waiting ones, and must leave them.
        nudge = await utils.add_job("other", {})
        await until(lambda: others == [nudge.id], what="a later fetch to run its job")
        assert (held.running, held.peak) == (2, 2)
        await utils.remove_limit(task="lim")  # removed: the rest start
        await until(lambda: held.running == 6, what="the rest to start once the limit is removed")
        held.release.set()


@pytest.mark.db
async def test_a_queue_limit_ends_the_leases_and_counts_their_running_jobs(
    utils: WorkerUtils, db: str
) -> None:
    held = Held()
    leases = "select count(*) from graphile_worker._private_py_limit_leases"
    async with worker(db, {"lim": held.task}, concurrency=10):
        await utils.set_limit(Limit(max_running=2), task="lim")
        await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 6)
        await until(lambda: held.running == 2, what="two limited jobs to start")
        assert value(db, leases) == 1
        # No lease while a queue has a limit: the two running jobs are counted.
        await utils.set_limit(Limit(max_running=1), queue="elsewhere")
        assert value(db, leases) == 0
        # Every job the pool held locked is counted, until the pool, told, gives
        # back those it had fetched ahead and not started: then the two running.
        locked = "select count(*) from graphile_worker._private_jobs where locked_at is not null"
        await until(lambda: value(db, locked) == 2, what="the jobs not started to be given back")
        (info,) = [i for i in await utils.list_limits() if i.kind == "task"]
        assert info.running == 2
        held.release.set()
        await until(
            lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
            what="every job to run",
        )
    assert held.peak == 2


FETCH_LEASED = (
    f"select id from graphile_worker.py_fetch_leased_jobs({TASKS}, null, %s, 'p', "
    "'{}', '{}', '{}', '{}', '{}', 10)"
)


@pytest.mark.db
async def test_no_lease_is_taken_while_a_queue_has_a_limit(utils: WorkerUtils, db: str) -> None:
    """A pool that has not heard of a queue's new limit leases nothing: not
    when its fetch waited for the limit being set, nor after."""
    await utils.set_limit(Limit(max_running=4), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 4)
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) values ('p', '60s')",
    )
    leases = "select coalesce(sum(slots), 0) from graphile_worker._private_py_limit_leases"
    assert len(rows(db, FETCH_LEASED, (1,))) == 1
    assert value(db, leases) == 1
    async with await psycopg.AsyncConnection.connect(db) as setter:
        await setter.execute("select graphile_worker.py_set_limit('queue', 'elsewhere', 1)")
        fetch = asyncio.create_task(asyncio.to_thread(rows, db, FETCH_LEASED, (10,)))
        await until(
            lambda: (
                value(
                    db,
                    "select count(*) from pg_stat_activity "
                    "where wait_event_type = 'Lock' and query like '%py_fetch_leased_jobs%'",
                )
                == 1
            ),
            what="the fetch to wait for the limit being set",
        )
        await setter.commit()
    # 3 slots free (the job fetched is counted), none leased, no job taken.
    assert await fetch == []
    assert value(db, leases) == 0
    assert rows(db, FETCH_LEASED, (10,)) == []
    assert value(db, leases) == 0
    (info,) = [i for i in await utils.list_limits() if i.kind == "task"]
    assert info.running == 1


def fetch_leased(
    db: str,
    pool: str,
    asks: Sequence[tuple[str, str, int, int, int]] = (),
    *,
    limit: int = 10,
    concurrency: int = 10,
) -> int:
    """A fetch under leases by ``pool`` of up to ``limit`` jobs, with its asks
    (task, partition value, holding, running, queued) as :meth:`Leases.asks`
    sends them; how many jobs."""
    columns = [list(column) for column in zip(*asks, strict=True)] or [[]] * 5
    return len(
        rows(
            db,
            f"select id from graphile_worker.py_fetch_leased_jobs({TASKS}, null, %s, %s, "
            "%s, %s, %s, %s, %s, %s)",
            (limit, pool, *columns, concurrency),
        )
    )


@pytest.mark.db
async def test_a_lease_ends_when_its_pool_may_run_nothing_of_its_key(
    utils: WorkerUtils, db: str
) -> None:
    """A pool whose jobs of a limit's key (here a partition value) have ended
    and that fetches none of it holds none of its slots: another pool gets
    them all."""
    await utils.set_limit(Limit(max_running=2, partition_by="account"), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {"account": "x"}}] * 2)
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('a', '60s'), ('b', '60s')",
    )
    slots = "select coalesce(sum(slots), 0) from graphile_worker._private_py_limit_leases"
    assert fetch_leased(db, "a") == 2
    finish(db, [row["id"] for row in rows(db, "select id from graphile_worker._private_jobs")])
    # Its jobs ended, none met: its target goes to 0, its slots stay what it
    # may start until that answer is granted (the target, 2).
    assert fetch_leased(db, "a", [("lim", "x", 2, 0, 0)]) == 0
    assert value(db, slots) == 2
    await utils.add_jobs([{"identifier": "lim", "payload": {"account": "x"}}] * 2)
    assert fetch_leased(db, "b") == 0  # all of x's slots held
    # Granted 0, the pool asks about x no more: the next fetch that meets no
    # job of it (here: none is due) ends its lease.
    rows(db, "update graphile_worker._private_jobs set run_at = now() + interval '1 hour'")
    assert fetch_leased(db, "a") == 0
    assert (
        value(
            db, "select count(*) from graphile_worker._private_py_limit_leases where pool_id = 'a'"
        )
        == 0
    )
    rows(db, "update graphile_worker._private_jobs set run_at = now()")
    assert fetch_leased(db, "b") == 2


@pytest.mark.db
async def test_a_job_counted_before_and_taken_again_under_a_lease_counts_once(
    utils: WorkerUtils, db: str
) -> None:
    """A job a pool without heartbeats took (counted in the running set),
    that failed and is taken again under a lease, counts once: when the
    leasing pool's other job ends, it may start it (it stalled for good)."""
    await utils.set_limit(Limit(max_running=1), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 2)
    first, second = (
        row["id"] for row in rows(db, "select id from graphile_worker._private_jobs order by id")
    )
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) values ('a', '60s')",
    )
    assert fetched(db, 1) == [first]  # a pool without heartbeats
    # It fails; its retry is due after the second job.
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = null, locked_by = null, "
        "run_at = now() - interval '1 second' + (id = %s)::int * interval '0.5 seconds'",
        (first,),
    )
    # A pool of 2 slots takes both ahead, under a lease of 1.
    assert fetch_leased(db, "a", limit=4, concurrency=2) == 2
    # It starts the second (first in order), which ends.
    finish(db, [second])
    fetch_leased(db, "a", [("lim", "", 1, 0, 1)], limit=4, concurrency=2)
    targets = "select target from graphile_worker._private_py_limit_leases where pool_id = 'a'"
    assert value(db, targets) == 1  # the first may start


@pytest.mark.db
async def test_a_backlog_of_a_full_value_holds_up_no_other_under_leases(
    utils: WorkerUtils, db: str
) -> None:
    """A fetch under leases looks past the jobs of a full partition value
    (up to 1,000, as the limited fetch): another value's job is found."""
    await utils.set_limit(Limit(max_running=1, partition_by="account"), task="lim")
    await utils.add_jobs(
        [{"identifier": "lim", "payload": {"account": "x"}}] * 10
        + [{"identifier": "lim", "payload": {"account": "y"}}] * 10
    )
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('a', '60s'), ('b', '60s')",
    )
    assert fetch_leased(db, "b", limit=1, concurrency=1) == 1  # x's slot
    # The 8 first candidates are all x's: past them, a job of y.
    assert fetch_leased(db, "a", limit=8, concurrency=8) == 1
    taken = "select payload->>'account' from graphile_worker._private_jobs where locked_by = 'a'"
    assert value(db, taken) == "y"


@pytest.mark.db
async def test_a_named_queues_jobs_are_taken_under_a_lease_one_at_a_time(
    utils: WorkerUtils, db: str
) -> None:
    """Under a lease, a job of a named queue is taken with its queue's lock,
    the first in order; the queue's next waits for it; other jobs go at once."""
    await utils.set_limit(Limit(max_running=5), task="lim")
    ids = [
        job.id
        for job in await utils.add_jobs(
            [
                {"identifier": "lim", "payload": {}, "queue_name": "mail", "priority": 1},
                {"identifier": "lim", "payload": {}, "queue_name": "mail", "priority": 0},
                {"identifier": "lim", "payload": {}},
            ]
        )
    ]
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('a', '60s'), ('b', '60s')",
    )
    assert fetch_leased(db, "a") == 2
    locked = "select id from graphile_worker._private_jobs where locked_by = 'a' order by id"
    assert [row["id"] for row in rows(db, locked)] == [ids[1], ids[2]]
    assert value(db, "select locked_by from graphile_worker._private_job_queues") == "a"
    assert fetch_leased(db, "b") == 0


@pytest.mark.db
async def test_a_late_start_given_back_by_a_pool_declared_dead_leaves_the_new_count(
    utils: WorkerUtils, db: str
) -> None:
    """A stalled pool declared dead, whose job another pool took and
    counted, uncounts its late start afterwards: the other pool's count
    stays (never 2 running of a limit of 1)."""
    await utils.set_limit(Limit(max_running=1), task="lim")
    first, _ = (job.id for job in await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 2))
    assert fetched(db, 10, "a") == [first]
    # Declared dead: its job released (as the sweep does); b takes and counts it.
    rows(db, "update graphile_worker._private_jobs set locked_at = null, locked_by = null")
    assert fetched(db, 10, "b") == [first]
    # a wakes: too late to start it, it gives its start back.
    rows(db, "select graphile_worker.py_uncount_starts(array[%s::bigint], 'a')", (first,))
    assert fetched(db, 10, "c") == []


@pytest.mark.db
async def test_a_late_start_given_back_leaves_the_jobs_earlier_starts(
    utils: WorkerUtils, db: str
) -> None:
    """Only the start counted with the job's lock is removed: its earlier
    attempt's start stays in the window (2 starts an hour: one more)."""
    await utils.set_limit(Limit(max_starts=2, per=3600), task="lim")
    first = (await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 3))[0].id
    unlock = "update graphile_worker._private_jobs set locked_at = null, locked_by = null"
    rows(db, f"{unlock}, run_at = now() + interval '1 hour' where id <> %s", (first,))
    assert fetched(db, 10, "a") == [first]  # its first attempt: 1 start
    rows(db, unlock)  # it failed; its retry is taken: 2 starts
    assert fetched(db, 10, "a") == [first]
    # Too late to start it: the retry's start is given back, the first one's stays.
    rows(db, "select graphile_worker.py_uncount_starts(array[%s::bigint], 'a')", (first,))
    rows(db, f"{unlock}, run_at = now()")
    assert len(fetched(db, 10, "b")) == 1


@pytest.mark.db
async def test_an_operation_slot_released_while_another_is_taken_is_free(
    utils: WorkerUtils, db: str
) -> None:
    """A release that commits while an acquire waits for the row is not
    written over: its slot is free for the next one."""
    await utils.set_limit(Limit(max_running=3), operation="stripe")
    ids = [job.id for job in await utils.add_jobs([{"identifier": "t", "payload": {}}] * 4)]
    rows(db, "update graphile_worker._private_jobs set locked_at = now(), locked_by = 'p'")
    acquire = "select graphile_worker.py_limit_acquire('stripe', '', %s)"
    for holder in ids[:2]:
        assert value(db, acquire, (holder,)) is None
    async with await psycopg.AsyncConnection.connect(db) as releaser:
        await releaser.execute(
            "select graphile_worker.py_limit_release('stripe', '', %s)", (ids[0],)
        )
        taking = asyncio.create_task(asyncio.to_thread(value, db, acquire, (ids[2],)))
        await until(
            lambda: (
                value(
                    db,
                    "select count(*) from pg_stat_activity "
                    "where wait_event_type = 'Lock' and query like '%py_limit_acquire%'",
                )
                == 1
            ),
            what="the acquire to wait for the release",
        )
        await releaser.commit()
    assert await taking is None
    assert value(db, acquire, (ids[3],)) is None  # 2 and 3 hold slots: the third is free


@pytest.mark.db
async def test_a_limited_tasks_jobs_in_a_busy_or_full_queue_hold_up_none_of_its_others(
    utils: WorkerUtils, db: str
) -> None:
    """Jobs of a limited task waiting for their named queue (held by another
    worker, or under a full limit) take no place in a fetch: the task's
    other jobs behind them are found."""
    await utils.set_limit(Limit(max_running=10, max_starts=100, per=3600), task="lim")
    await utils.add_jobs(
        [{"identifier": "lim", "payload": {}, "queue_name": "mail"}] * 3
        + [{"identifier": "lim", "payload": {}}] * 5
    )
    queued = "select array_agg(id order by id) from graphile_worker._private_jobs"
    mail = set(value(db, f"{queued} where job_queue_id is not null"))
    rows(db, "update graphile_worker._private_job_queues set locked_at = now(), locked_by = 'x'")
    # Fetches of 2: the queue's jobs come first, and its queue is held.
    taken = [fetched(db, 2) for _ in range(2)]
    assert [len(batch) for batch in taken] == [2, 2]
    assert not mail & {i for batch in taken for i in batch}
    # The queue free again, but under a limit that is full (its one start
    # an hour spent).
    rows(db, "update graphile_worker._private_job_queues set locked_at = null, locked_by = null")
    await utils.set_limit(Limit(max_starts=1, per=3600), queue="mail")
    rows(
        db,
        "insert into graphile_worker._private_py_limit_state "
        "(kind, name, partition, running, starts, started) "
        "values ('queue', 'mail', '', '{}', array[now()], array[0::bigint]) "
        "on conflict (kind, name, partition) do update "
        "set starts = excluded.starts, started = excluded.started",
    )
    finish(db, [i for batch in taken for i in batch])
    [last] = fetched(db, 1)  # the last queue-less job, past the 3 of "mail"
    assert last not in mail


@pytest.mark.db
async def test_a_job_not_started_in_time_is_given_back_and_its_start_uncounted(
    utils: WorkerUtils, db: str
) -> None:
    """A job a rate limit let start that the pool could not start within
    START_WITHIN of its count (a stalled process) is not run: its start is
    removed from the window and it is given back, attempt restored."""
    await utils.set_limit(Limit(max_running=5, max_starts=2, per=60), task="lim")
    await utils.add_jobs([{"identifier": "lim", "payload": {}}] * 3)
    task_id = value(db, "select id from graphile_worker._private_tasks")
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
        read_payloads_raw(conn)  # as the fetcher reads them
        cur = await conn.execute(
            "select * from graphile_worker.py_fetch_limited_jobs("
            "array(select id from graphile_worker._private_tasks), null, 5, 'p')"
        )
        fetched_rows = await cur.fetchall()
    jobs = jobs_from_rows(fetched_rows, {task_id: "lim"})
    assert len(jobs) == 2  # 2 starts a minute
    given_back: list[Job] = []

    async def give_back(late: Sequence[Job]) -> None:
        given_back.extend(late)
        rows(
            db,
            "update graphile_worker._private_jobs set locked_at = null, locked_by = null, "
            "attempts = attempts - 1 where id = any(%s)",
            ([job.id for job in late],),
        )

    deadlines = StartDeadlines(
        utils.pool, schema="graphile_worker", pool_id="p", give_back=give_back, nudge=lambda: None
    )
    clock = ClockBound()
    async with utils.pool.connection() as conn:
        await clock.refresh(conn)
    # The first job counted a minute from now (in time whatever this machine's
    # load), the second when fetched, START_WITHIN * 1.5 ago by its admission.
    assert jobs[0].locked_at is not None
    in_time = jobs[0]._replace(locked_at=jobs[0].locked_at + timedelta(minutes=1))
    deadlines.set([in_time, jobs[1]], clock)
    assert deadlines.admit(in_time)  # in time
    await asyncio.sleep(START_WITHIN * 1.5)
    assert not deadlines.admit(jobs[1])  # stalled: too late
    loop = asyncio.create_task(deadlines.run())
    try:
        for _ in range(200):
            if given_back:
                break
            await asyncio.sleep(0.01)
    finally:
        loop.cancel()
    assert [job.id for job in given_back] == [jobs[1].id]
    [state] = rows(db, "select running, started from graphile_worker._private_py_limit_state")
    assert (state["running"], state["started"]) == ([jobs[0].id], [jobs[0].id])
    # Its start no longer counts: the next fetch may start one more.
    assert len(fetched(db)) == 1


@pytest.mark.db
async def test_once_runs_every_job_when_a_stalled_loop_makes_starts_late(
    utils: WorkerUtils, db: str
) -> None:
    """Each job blocks the event loop longer than START_WITHIN, so the jobs
    fetched with it start late, are given back uncounted, and are fetched
    again: --once still runs them all, each once, and exits."""
    ran: list[int] = []

    async def stall(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)
        time.sleep(START_WITHIN * 1.6)  # noqa: ASYNC251 (the stall under test)

    await utils.set_limit(Limit(max_starts=100, per=1), task="stall")
    added = await utils.add_jobs([{"identifier": "stall", "payload": {}}] * 5)
    async with asyncio.timeout(30):
        await run_once(db, task_list={"stall": stall}, concurrency=5, no_handle_signals=True)
    assert sorted(ran) == sorted(j.id for j in added)
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


# --- Operations inside a task (helpers.limit) -----------------------------------


@pytest.mark.db
async def test_an_operation_limit_holds_across_jobs_and_a_full_one_snoozes(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_running=1), operation="partner")
    inside = peak = 0
    entered: list[int] = []

    async def call(payload: Any, helpers: Helpers) -> None:
        nonlocal inside, peak
        await asyncio.sleep(0)  # all four start before the first enters
        async with helpers.limit("partner"):
            inside += 1
            peak = max(peak, inside)
            entered.append(helpers.job.id)
            await asyncio.sleep(0.1)
            inside -= 1

    jobs = await utils.add_jobs([{"identifier": "call", "payload": {}}] * 4)
    async with worker(db, {"call": call}, concurrency=4, poll_interval=0.1):
        for _ in range(400):
            if value(db, "select count(*) from graphile_worker._private_jobs") == 0:
                break
            await asyncio.sleep(0.05)
    assert peak == 1
    assert sorted(entered) == sorted(j.id for j in jobs)  # each entered once
    # The ones held back snoozed: no attempt spent, so every job succeeded at
    # its first attempt.
    attempts = "select attempts from graphile_worker._private_py_job_history order by job_id"
    assert [r["attempts"] for r in rows(db, attempts)] == [1, 1, 1, 1]


@pytest.mark.db
async def test_an_operation_rate_limit_per_partition_in_a_plain_task(
    utils: WorkerUtils, db: str
) -> None:
    await utils.set_limit(Limit(max_starts=2, per=60), operation="mail")
    entered: list[tuple[str, int]] = []

    def send(payload: Any, helpers: Helpers) -> None:
        with helpers.limit("mail", partition=payload["to"]):
            entered.append((payload["to"], helpers.job.id))

    added = await utils.add_jobs(
        [{"identifier": "send", "payload": {"to": to}} for to in ["a", "a", "a", "b"]]
    )
    await run_once(db, task_list={"send": send}, no_handle_signals=True)
    assert sorted(to for to, _ in entered) == ["a", "a", "b"]
    # The third to "a" snoozed until the window frees a start (a minute).
    [row] = rows(db, "select attempts, run_at - now() as wait from graphile_worker._private_jobs")
    assert row["attempts"] == 0
    assert timedelta(seconds=50) < row["wait"] <= timedelta(seconds=60)
    assert {job_id for _, job_id in entered} <= {j.id for j in added}


@pytest.mark.db
async def test_an_unknown_operation_limit_fails_the_job_with_one_clear_line(
    utils: WorkerUtils, db: str
) -> None:
    async def call(payload: Any, helpers: Helpers) -> None:
        async with helpers.limit("nosuch"):
            pass

    job = await utils.add_job("call", {}, max_attempts=1)
    await run_once(db, task_list={"call": call}, no_handle_signals=True)
    record = await utils.get_job_result(job.id)
    assert record.state == "failed"
    assert record.last_error is not None
    assert record.last_error.splitlines()[0] == (
        "LookupError: helpers.limit: no limit named 'nosuch'; set one with "
        "set_limit(Limit(...), operation='nosuch')"
    )


# --- The fleet: four processes ----------------------------------------------------

RECORD = """\
import asyncio
import os
import time


async def task(payload, helpers):
    started = time.time()
    job = helpers.job
    # A run after its worker was declared dead: when its job was released.
    reaped = job.updated_at if "declared dead" in (job.last_error or "") else None
    async with helpers.with_pg_client() as conn:
        await conn.execute(
            "insert into public.starts (job_id, pid, at, reaped)"
            " values (%s, %s, to_timestamp(%s), %s)",
            (helpers.job.id, os.getpid(), started, reaped),
        )
    await asyncio.sleep(payload["sleep"])
    finished = time.time()
    async with helpers.with_pg_client() as conn:
        await conn.execute(
            "insert into public.ends (job_id, pid, at) values (%s, %s, to_timestamp(%s))",
            (helpers.job.id, os.getpid(), finished),
        )
"""

#: Jobs open at once: each run from its start to its end, or, for a run that
#: never ended (its worker was killed), to the moment its job was released
#: (its pool declared dead: the next run of the job says when).
MOST_AT_ONCE = """
  with starts as (
    select s.*,
      (select min(n.at) from public.starts as n where n.job_id = s.job_id and n.at > s.at) as next
    from public.starts as s
  ),
  runs as (
    select s.job_id, s.at as started,
      coalesce(
        (select min(e.at) from public.ends as e
          where e.job_id = s.job_id and e.at >= s.at and (s.next is null or e.at < s.next)),
        (select n.reaped from public.starts as n where n.job_id = s.job_id and n.at = s.next),
        'infinity'
      ) as ended
    from starts as s
  )
  select max((select count(*) from runs as o where o.started <= r.started and o.ended > r.started))
  from runs as r
"""

#: The most starts in any window of one second (each window starting at a start).
MOST_PER_SECOND = """
  select max((select count(*) from public.starts as o
    where o.at >= s.at and o.at < s.at + interval '1 second'))
  from public.starts as s
"""


def make_fleet_tasks(folder: Path) -> Path:
    (folder / "tasks").mkdir(parents=True)
    (folder / "tasks" / "lim.py").write_text(RECORD)
    return folder


#: The fleet tests' limit: 3 at once and 50 starts a second.
FLEET_LIMIT = Limit(max_running=3, max_starts=50, per=1)


async def fleet_jobs(
    utils: WorkerUtils,
    db: str,
    short: int = 1850,
    long: int = 150,
    limit: Limit = FLEET_LIMIT,
) -> int:
    rows(
        db,
        "create table public.starts (job_id bigint, pid int, at timestamptz, reaped timestamptz)",
    )
    rows(db, "create table public.ends (job_id bigint, pid int, at timestamptz)")
    await utils.set_limit(limit, task="lim")
    # Short jobs: the rate binds (3 at once could start 300 a second); long
    # ones: the 3 slots bind.
    jobs = [{"identifier": "lim", "payload": {"sleep": 0.01}} for _ in range(short)]
    jobs[::13] = [{"identifier": "lim", "payload": {"sleep": 0.15}}] * len(jobs[::13])
    jobs += [{"identifier": "lim", "payload": {"sleep": 0.15}} for _ in range(long)]
    await utils.add_jobs(jobs)
    return len(jobs)


def check_fleet(db: str, count: int, killed: int = -1, rate: bool = True) -> None:
    """Never 4 at once, never 51 starts in a second (``rate``), every job ran
    to its end, and once: but for a job the ``killed`` worker had finished
    without its result being written before the kill (at-least-once: it runs
    again)."""
    assert value(db, MOST_AT_ONCE) == 3
    if rate:
        assert value(db, MOST_PER_SECOND) <= 50
    assert value(db, "select count(distinct job_id) from public.ends") == count
    others = "from public.ends where pid <> %s"
    assert value(db, f"select count(*) {others}", (killed,)) == value(
        db, f"select count(distinct job_id) {others}", (killed,)
    )
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


@pytest.mark.db
@pytest.mark.slow  # 2,000 jobs at 50 starts a second: 40 s at least
async def test_four_workers_hold_3_at_once_and_50_starts_a_second(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """The issue's acceptance: 4 processes, 2,000 jobs of a task limited to 3
    at once and 50 starts a second: never 4 at once, never 51 starts in a
    second, every job once."""
    count = await fleet_jobs(utils, db)
    folder = make_fleet_tasks(tmp_path)
    procs = [start([cli_path(), "-c", db, "-j", "5"], folder) for _ in range(4)]
    try:
        wait_for(db, "select count(*) from public.ends", count, timeout=180)
    finally:
        results = stop(procs)
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    check_fleet(db, count)
    assert value(db, "select count(distinct pid) from public.starts") == 4


@pytest.mark.db
@pytest.mark.slow  # 600 jobs at 50 starts a second: 12 s at least
@pytest.mark.parametrize("leased", [False, True], ids=["counted", "leased"])
async def test_a_killed_workers_slots_come_back_after_its_heartbeat_timeout(
    utils: WorkerUtils, db: str, tmp_path: Path, leased: bool
) -> None:
    # Fewer jobs than the fleet test above: the kill comes at the first long
    # job, and its slot must come back for the rest to finish. Leased: the
    # limit is max_running only, its slots leased (the dead pool's lease
    # goes with its heartbeat row, as its jobs' locks do).
    limit = Limit(max_running=3) if leased else FLEET_LIMIT
    count = await fleet_jobs(utils, db, short=560, long=40, limit=limit)
    folder = make_fleet_tasks(tmp_path)
    args = [cli_path(), "-c", db, "-j", "5", "--heartbeat-interval", "0.5"]
    args += ["--heartbeat-timeout", "2"]
    procs = [start(args, folder) for _ in range(4)]
    try:
        # Kill a worker while it runs a long job (holding one of the 3 slots).
        victim_pid = None
        deadline = time.monotonic() + 60
        while victim_pid is None:
            assert time.monotonic() < deadline, "no long job started"
            victim_pid = value(
                db,
                "select s.pid from public.starts as s "
                "join graphile_worker._private_jobs as j on j.id = s.job_id "
                "where j.payload->>'sleep' = '0.15' and j.locked_at is not null "
                "and not exists (select from public.ends as e where e.job_id = s.job_id) "
                "limit 1",
            )
        victim = next(p for p in procs if p.pid == victim_pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        wait_for(db, "select count(distinct job_id) from public.ends", count, timeout=180)
    finally:
        results = stop([p for p in procs if p is not victim])
    assert [code for code, _ in results] == [0, 0, 0], results
    assert value(db, "select count(*) from public.starts where pid = %s", (victim_pid,)) > 0
    check_fleet(db, count, killed=victim_pid, rate=not leased)


@pytest.mark.db
async def test_four_workers_share_a_leased_limit_of_3_and_never_run_4(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """A limit of max_running only is leased (migrations/py/000028.sql): each
    pool starts its jobs under its share of the slots without asking. Four
    processes, 1,000 jobs (short ones and long ones): never 4 at once, every
    job once, and the slots shared (a pool that wants slots gets its share:
    one each here, so at least three workers ran jobs)."""
    count = await fleet_jobs(utils, db, short=920, long=80, limit=Limit(max_running=3))
    folder = make_fleet_tasks(tmp_path)
    procs = [start([cli_path(), "-c", db, "-j", "5"], folder) for _ in range(4)]
    try:
        # (The run takes seconds: its jobs are fetched under leases.)
        wait_for(db, "select least(count(*), 1) from graphile_worker._private_py_limit_leases", 1)
        wait_for(db, "select count(*) from public.ends", count, timeout=180)
    finally:
        results = stop(procs)
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    check_fleet(db, count, rate=False)
    assert value(db, "select count(distinct pid) from public.starts") >= 3
    # Each pool's leases went with its heartbeat row as it stopped.
    assert value(db, "select count(*) from graphile_worker._private_py_limit_leases") == 0


@pytest.mark.db
async def test_leases_and_a_worker_without_heartbeats_share_one_count(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """A worker with heartbeats off takes a leased limit's jobs a statement at
    a time, counted with the leases of the others, which count its jobs:
    never 4 at once. (It asks at each of its completions and takes the slots
    as they free: the leasing workers may get none meanwhile.)"""
    count = await fleet_jobs(utils, db, short=560, long=40, limit=Limit(max_running=3))
    folder = make_fleet_tasks(tmp_path)
    plain = start([cli_path(), "-c", db, "-j", "5", "--heartbeat-interval", "0"], folder)
    procs = []
    try:
        # The others start once it runs the limit's jobs: they meet its count.
        wait_for(db, "select least(count(*), 3) from public.starts", 3, timeout=60)
        procs = [start([cli_path(), "-c", db, "-j", "5"], folder) for _ in range(2)]
        wait_for(db, "select count(*) from public.ends", count, timeout=180)
    finally:
        results = stop([*procs, plain])
    assert [code for code, _ in results] == [0, 0, 0], results
    check_fleet(db, count, rate=False)


#: MOST_AT_ONCE for each value of the jobs' "account" (public.accounts), the
#: largest.
MOST_AT_ONCE_PER_ACCOUNT = (
    MOST_AT_ONCE.replace(
        "from starts as s\n", "from starts as s join public.accounts as a using (job_id)\n"
    )
    .replace(
        "    select s.job_id, s.at as started,", "    select s.job_id, a.account, s.at as started,"
    )
    .replace(
        "where o.started <= r.started", "where o.account = r.account and o.started <= r.started"
    )
)


@pytest.mark.db
async def test_three_workers_lease_each_accounts_slots_and_never_run_3_of_one(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """A partitioned max_running limit is leased per value: 3 processes, 600
    jobs of 3 accounts limited to 2 at once each: never 3 of one account at
    once, every job once."""
    rows(
        db,
        "create table public.starts (job_id bigint, pid int, at timestamptz, reaped timestamptz)",
    )
    rows(db, "create table public.ends (job_id bigint, pid int, at timestamptz)")
    await utils.set_limit(Limit(max_running=2, partition_by="account"), task="lim")
    jobs = [
        {
            "identifier": "lim",
            "payload": {"sleep": 0.002 if n % 7 else 0.05, "account": f"a{n % 3}"},
        }
        for n in range(600)
    ]
    await utils.add_jobs(jobs)
    rows(
        db,
        "create table public.accounts as select id as job_id, payload->>'account' as account "
        "from graphile_worker._private_jobs",
    )
    folder = make_fleet_tasks(tmp_path)
    procs = [start([cli_path(), "-c", db, "-j", "5"], folder) for _ in range(3)]
    leases = "select count(*) from graphile_worker._private_py_limit_leases"
    try:
        # (The run takes seconds: its jobs are fetched under leases.)
        wait_for(db, f"select least(({leases}), 1)", 1)
        wait_for(db, "select count(*) from public.ends", len(jobs), timeout=180)
        # Nothing left to run: within a fetch or two (one each 2 s) no slot
        # is held by any worker.
        wait_for(db, f"select (({leases}) = 0)::int", 1, timeout=20)
    finally:
        results = stop(procs)
    assert [code for code, _ in results] == [0, 0, 0], results
    assert value(db, MOST_AT_ONCE_PER_ACCOUNT) == 2
    assert value(db, "select count(*) from public.ends") == len(jobs)
    assert value(db, "select count(distinct job_id) from public.ends") == len(jobs)
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


@pytest.mark.db
def test_the_readmes_limits_example_runs_as_written(db: str, tmp_path: Path) -> None:
    from readme_blocks import run_transcript

    outputs, expected = run_transcript("### Concurrency and rate limits", db, tmp_path)
    assert outputs == expected
