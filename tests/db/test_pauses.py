"""Pausing and resuming a named queue or a task, fleet-wide (README, "Pause
and resume"): paused jobs start on no Python worker (nor a worker started
later) until resumed or the pause ends by itself; running jobs finish; jobs
fetched before the pause are given back; Node keeps off a held queue."""

from __future__ import annotations

import asyncio
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import admin_cli, cli_path, rows, value
from worker_fleet import create_runs, make_tasks, start, stop, wait_for
from workers import until, worker

from worker_cli import (
    Helpers,
    Job,
    JobSpecError,
    Pause,
    WorkerUtils,
    make_sync_worker_utils,
)
from worker_cli.client.utils_plans import UtilsPlans
from worker_cli.worker.background.pause_watch import Pauses, PauseSet

QUEUES = "graphile_worker._private_job_queues"
FETCH = (
    "select id from graphile_worker.py_fetch_jobs("
    "array(select id from graphile_worker._private_tasks), null, 100, 'p') order by id"
)


def job(identifier: str = "t", queue: str | None = None, id_: int = 1) -> Job:
    now = datetime.now(UTC)
    return Job(
        id_, None, 1, {}, 0, now, 1, 25, None, now, now, None, now, "p", 0, None, False,
        identifier, queue,
    )  # fmt: skip


# --- Unit: the pause set and the arguments ------------------------------------


@pytest.mark.unit
def test_a_pause_set_covers_its_tasks_and_queues_and_star_means_all() -> None:
    paused = PauseSet(frozenset({"mail"}), frozenset({"charge"}))
    assert paused.covers(job("charge"))
    assert paused.covers(job("other", "mail"))
    assert not paused.covers(job("other", "sms"))
    assert not paused.covers(job("other"))
    assert PauseSet(frozenset({"*"})).covers(job("x", "any"))
    assert not PauseSet(frozenset({"*"})).covers(job("x"))  # '*' queues: named ones only
    assert PauseSet(tasks=frozenset({"*"})).covers(job("x"))
    assert not PauseSet()


@pytest.mark.unit
def test_a_fetch_that_was_in_flight_when_the_pause_came_is_held_back() -> None:
    state = Pauses()
    fetched = [job("a", id_=1), job("b", id_=2), job("c", "q", id_=3)]
    assert state.hold_back(fetched) is fetched  # nothing paused: untouched
    state.current = PauseSet(frozenset({"q"}), frozenset({"b"}))
    assert [j.id for j in state.hold_back(fetched)] == [1]
    assert state.changed.is_set()
    assert [j.id for j in state.take_held()] == [2, 3]
    assert state.take_held() == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "queue"),
        ({"queue": "a", "task": "b"}, "queue"),
        ({"queue": ""}, "queue"),
        ({"task": "x" * 129}, "task"),
        ({"queue": "a", "until": datetime(2030, 1, 1)}, "until"),
        ({"queue": "a", "until": 0}, "until"),
        ({"queue": "a", "until": timedelta(days=400)}, "until"),
        ({"queue": "a", "until": "10m"}, "until"),
        ({"queue": "a", "reason": 5}, "reason"),
        # What PostgreSQL's text cannot hold: refused, not a raw database error.
        ({"queue": "a", "reason": "a\x00b"}, "reason"),
        ({"queue": "a", "reason": "\udcff"}, "reason"),
        ({"queue": "a\x00"}, "queue"),
        ({"task": "\ud800"}, "task"),
        ({"task": "a", "hold_queue_lock": True}, "hold_queue_lock"),
        ({"queue": "*", "hold_queue_lock": True}, "hold_queue_lock"),
    ],
)
def test_bad_pause_arguments_name_the_field_before_any_sql(
    kwargs: dict[str, Any], field: str
) -> None:
    arguments = {"queue": None, "task": None, "until": None, "reason": None}
    arguments |= {"hold_queue_lock": False, **kwargs}
    with pytest.raises(JobSpecError) as caught:
        UtilsPlans("graphile_worker").pause(**arguments)  # the plan of utils.pause, not run
    assert caught.value.field == field


# --- The database: pausing, listing, the fetch -------------------------------


@pytest.mark.db
async def test_pause_list_resume_async_sync_and_sql(utils: WorkerUtils, db: str) -> None:
    paused = await utils.pause(queue="mail", until=timedelta(minutes=10), reason="deploy")
    assert (paused.kind, paused.name, paused.reason, paused.hold_queue_lock) == (
        "queue",
        "mail",
        "deploy",
        False,
    )
    assert paused.resume_at is not None
    assert timedelta(minutes=9) < paused.resume_at - paused.paused_at <= timedelta(minutes=10)
    with make_sync_worker_utils(connection_string=db) as sync:
        again = sync.pause(queue="mail")  # pausing again replaces until and reason
        assert (again.resume_at, again.reason, again.paused_at) == (None, None, paused.paused_at)
        sync.pause(task="charge", until=datetime.now(UTC) + timedelta(hours=1))
        assert [(p.kind, p.name) for p in sync.list_pauses()] == [
            ("queue", "mail"),
            ("task", "charge"),
        ]
        assert sync.resume(task="charge") is True
        assert sync.resume(task="charge") is False
    rows(db, "select graphile_worker.py_pause('task', 'report', reason => 'from psql')")
    listed = await utils.list_pauses()
    assert [(p.kind, p.name, p.reason) for p in listed] == [
        ("queue", "mail", None),
        ("task", "report", "from psql"),
    ]
    assert all(isinstance(p, Pause) for p in listed)
    assert value(db, "select graphile_worker.py_resume('queue', 'mail')") is True
    assert [p.name for p in await utils.list_pauses()] == ["report"]


@pytest.mark.db
async def test_the_fetch_leaves_paused_queues_and_tasks_alone(utils: WorkerUtils, db: str) -> None:
    ids = {
        name: (await utils.add_job(task, {}, queue_name=queue)).id
        for name, task, queue in [
            ("plain", "t", None),
            ("other_task", "u", None),
            ("mail", "t", "mail"),
            ("sms", "t", "sms"),
        ]
    }

    def fetch() -> list[int]:
        fetched = [row["id"] for row in rows(db, FETCH)]
        rows(db, "update graphile_worker._private_jobs set locked_at = null, locked_by = null")
        rows(
            db, "update graphile_worker._private_job_queues set locked_at = null, locked_by = null"
        )
        return fetched

    everything = sorted(ids.values())
    assert fetch() == everything
    await utils.pause(queue="mail")
    await utils.pause(task="u")
    assert fetch() == sorted([ids["plain"], ids["sms"]])
    await utils.pause(queue="*")
    assert fetch() == [ids["plain"]]
    await utils.resume(queue="*")
    await utils.resume(queue="mail")
    await utils.pause(task="*")
    assert fetch() == []
    await utils.resume(task="*")
    # A pause that has ended (resume_at passed) holds nothing, deleted or not.
    rows(
        db,
        "update graphile_worker._private_py_pauses set resume_at = now() - interval '1 second'",
    )
    assert fetch() == everything
    assert await utils.list_pauses() == []
    [(ended, _, _)] = [
        tuple(r.values()) for r in rows(db, "select * from graphile_worker.py_hold_paused_queues()")
    ]
    assert ended == 1
    assert value(db, "select count(*) from graphile_worker._private_py_pauses") == 0


@pytest.mark.db
def test_the_cli_pauses_lists_and_resumes_with_one_line_for_bad_input(db: str) -> None:
    done = admin_cli("pause", "-c", db, "--queue", "mail", "--for", "10m", "--reason", "deploy")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Paused queue mail: paused since ")
    assert "(deploy)" in done.stdout
    assert admin_cli("pause", "-c", db, "--task", "*").returncode == 0
    listed = admin_cli("pauses", "-c", db).stdout.splitlines()
    assert [line.split(":")[0] for line in listed] == ["queue mail", "every task"]
    as_json = json.loads(admin_cli("pauses", "-c", db, "--json").stdout)
    assert [(p["kind"], p["name"], p["reason"], p["hold_queue_lock"]) for p in as_json] == [
        ("queue", "mail", "deploy", False),
        ("task", "*", None, False),
    ]
    assert as_json[0]["resume_at"] > as_json[0]["paused_at"] and as_json[1]["resume_at"] is None
    # resume answers as pause said it: "every task", "every named queue".
    assert admin_cli("resume", "-c", db, "--task", "*").stdout == "Resumed every task\n"
    assert admin_cli("resume", "-c", db, "--task", "*").stdout == (
        "No pause of every task was in force\n"
    )
    assert admin_cli("pause", "-c", db, "--queue", "*").stdout.startswith(
        "Paused every named queue"
    )
    assert admin_cli("resume", "-c", db, "--queue", "*").stdout == (
        "Resumed every named queue (queues still paused on their own: mail)\n"
    )
    assert admin_cli("pause", "-c", db, "--queue", "mail").returncode == 0
    for args, message in [
        ((), "give either --queue NAME or --task IDENTIFIER"),
        (("--queue", "a", "--for", "0s"), "a pause lasts above 0 and at most 366 days"),
        (("--queue", "a", "--for", "soon"), "is not a length such as 90s"),
        (("--queue", "a", "--until", "2030-01-01T00:00"), "has no time zone"),
        (("--queue", "a", "--for", "1m", "--until", "2030-01-01T00:00Z"), "not both"),
        (("--task", "a", "--hold-queue-lock"), "hold_queue_lock: holds one named queue's lock"),
    ]:
        failed = admin_cli("pause", "-c", db, *args)
        assert failed.returncode == 2, (args, failed.stdout)
        assert message in failed.stderr, (args, failed.stderr)
        assert "Traceback" not in failed.stderr
    assert [p["name"] for p in rows(db, "select name from graphile_worker._private_py_pauses")] == [
        "mail"
    ]


# --- One worker: running jobs finish, fetched ones are given back ------------


@pytest.mark.db
async def test_a_pause_gives_back_fetched_jobs_and_lets_the_running_one_finish(
    utils: WorkerUtils, db: str
) -> None:
    release = asyncio.Event()
    started: list[int] = []

    async def slow(payload: Any, helpers: Helpers) -> None:
        started.append(helpers.job.id)
        await release.wait()

    added = await utils.add_jobs([{"identifier": "slow", "payload": {}} for _ in range(10)])
    async with worker(
        db, {"slow": slow}, concurrency=1, local_queue_size=20, local_queue_horizon=math.inf
    ) as runner:
        await until(lambda: len(started) == 1, what="the first job to start")
        locked = "select count(*) from graphile_worker._private_jobs where locked_by is not null"
        assert value(db, locked) == 10  # one running, nine fetched ahead
        await utils.pause(task="slow")
        await until(lambda: value(db, locked) == 1, what="the fetched jobs to be given back")
        assert value(db, "select sum(attempts) from graphile_worker._private_jobs") == 1
        release.set()
        await until(lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 9)
        await asyncio.sleep(0.3)  # a few fetches' worth: nothing else starts
        assert len(started) == 1
        assert await utils.resume(task="slow")
        await until(lambda: len(started) == 10, what="the rest to run after the resume")
        await runner.stop()
    assert sorted(started) == sorted(j.id for j in added)


@pytest.mark.db
async def test_a_pause_that_ends_by_itself_lets_its_jobs_run(utils: WorkerUtils, db: str) -> None:
    ran: list[int] = []

    async def t(payload: Any, helpers: Helpers) -> None:
        ran.append(helpers.job.id)

    await utils.pause(queue="q", until=timedelta(seconds=1))
    added = await utils.add_job("t", {}, queue_name="q")
    async with worker(db, {"t": t}, poll_interval=0.2):
        await asyncio.sleep(0.5)
        assert ran == []
        await until(lambda: ran == [added.id], within=5, what="the job to run once the pause ended")
    assert await utils.list_pauses() == []


# --- The fleet: three processes, one started while paused ---------------------


@pytest.mark.db
async def test_three_workers_stop_starting_paused_jobs_within_a_second(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """The issue's acceptance: jobs of a paused queue and of a paused task do
    not start on any of 3 workers a second after the pause; a worker started
    while paused does not run them; resume runs them, each once."""
    folder = make_tasks(tmp_path, ["record", "other"])
    create_runs(db)
    jobs: list[dict[str, Any]] = [
        {"identifier": "record", "payload": {"sleep": 0.2}} for _ in range(150)
    ]
    jobs += [
        {"identifier": "other", "payload": {"sleep": 0.2}, "queue_name": f"q{n % 6}"}
        for n in range(60)
    ]
    await utils.add_jobs(jobs)
    procs = [start([cli_path(), "-c", db, "-j", "4"], folder) for _ in range(3)]
    try:
        wait_for(db, "select count(*) from public.runs", 20)
        await utils.pause(task="record")
        for n in range(6):
            await utils.pause(queue=f"q{n}")
        paused_at = value(db, "select now()")
        await asyncio.sleep(1.5)
        late = "select count(*) from public.runs where started > %s"
        assert value(db, late, (paused_at + timedelta(seconds=1),)) == 0
        before = value(db, "select count(*) from public.runs")
        assert before < len(jobs)
        procs.append(start([cli_path(), "-c", db, "-j", "4"], folder))
        wait_for(db, "select count(*) from graphile_worker._private_py_heartbeats", 4)
        await asyncio.sleep(1.0)  # its first fetches, and a poll
        assert value(db, late, (paused_at + timedelta(seconds=1),)) == 0
        await utils.resume(task="record")
        for n in range(6):
            await utils.resume(queue=f"q{n}")
        wait_for(db, "select count(*) from public.runs", len(jobs))
        fourth = rows(
            db,
            "select count(*) as n from public.runs where started > %s",
            (paused_at + timedelta(seconds=1),),
        )[0]["n"]
        assert fourth == len(jobs) - before
    finally:
        results = stop(procs)
    assert [code for code, _ in results] == [0, 0, 0, 0], results
    assert value(db, "select count(distinct job_id) from public.runs") == len(jobs)
    assert value(db, "select count(*) from public.runs") == len(jobs)


# --- Node keeps off a held queue ----------------------------------------------


@pytest.mark.db
async def test_a_held_queue_is_locked_as_py_paused_once_free_and_given_back_on_resume(
    utils: WorkerUtils, db: str
) -> None:
    queues = "select queue_name, locked_by from graphile_worker._private_job_queues order by 1"
    await utils.pause(queue="empty", hold_queue_lock=True)  # no row yet: one is made, locked
    await utils.add_job("t", {}, queue_name="busy")
    rows(db, f"update {QUEUES} set locked_at = now(), locked_by = 'w1' where queue_name = 'busy'")
    await utils.pause(queue="busy", hold_queue_lock=True)
    assert [tuple(r.values()) for r in rows(db, queues)] == [("busy", "w1"), ("empty", "py:paused")]
    rows(db, f"update {QUEUES} set locked_at = null, locked_by = null where locked_by = 'w1'")
    rows(db, "select graphile_worker.py_hold_paused_queues()")  # the pools' upkeep
    assert [tuple(r.values()) for r in rows(db, queues)] == [
        ("busy", "py:paused"),
        ("empty", "py:paused"),
    ]
    await utils.pause(queue="busy")  # paused again without the hold: Node may run it
    await utils.resume(queue="empty")
    assert [tuple(r.values()) for r in rows(db, queues)] == [("busy", None), ("empty", None)]
    # A lock taken an hour ago is taken again, so no 4-hour sweep releases it.
    await utils.pause(queue="busy", hold_queue_lock=True)
    rows(
        db,
        "update graphile_worker._private_job_queues set locked_at = now() - interval '61 minutes'",
    )
    rows(db, "select graphile_worker.py_hold_paused_queues()")
    age = f"select now() - locked_at from {QUEUES} where queue_name = 'busy'"
    assert value(db, age) < timedelta(minutes=1)


@pytest.mark.node
@pytest.mark.db
async def test_node_runs_nothing_of_a_held_queue_until_it_is_resumed(
    utils: WorkerUtils, db: str, tmp_path: Path, node: Any
) -> None:
    folder = make_tasks(tmp_path, ["shared"], node=True)
    create_runs(db)
    await utils.pause(queue="held", hold_queue_lock=True)
    await utils.add_jobs(
        [{"identifier": "shared", "payload": {}, "queue_name": "held"} for _ in range(3)]
        + [{"identifier": "shared", "payload": {}, "queue_name": "free"}]
    )
    proc = start(node.argv("-c", db, "-j", "2"), folder)
    try:
        wait_for(db, "select count(*) from public.runs", 1)
        await asyncio.sleep(1.0)  # several of Node's fetches (jobs:insert, then polls)
        assert [r["payload"] for r in rows(db, "select payload from public.runs")] == [{}]
        assert value(db, "select count(*) from graphile_worker._private_jobs") == 3
        await utils.resume(queue="held")
        await utils.add_job("shared", {})  # Node polls every 2 s; this wakes it at once
        wait_for(db, "select count(*) from public.runs", 5)
    finally:
        stop([proc])  # (Node's CLI ends on SIGINT with the signal's code)
    assert json.dumps(value(db, "select count(distinct job_id) from public.runs")) == "5"


@pytest.mark.db
def test_the_readmes_pause_example_runs_as_written(db: str, tmp_path: Path) -> None:
    from readme_blocks import run_transcript

    outputs, expected = run_transcript("### Pause and resume", db, tmp_path)
    assert outputs == expected
