"""Every job_key rule of the reference guide, through SQL and through WorkerUtils."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, value
from psycopg.rows import dict_row
from workers import until, worker

from worker_cli import (
    Helpers,
    JobSpecError,
    SyncWorkerUtils,
    WorkerUtils,
    make_sync_worker_utils,
    make_worker_utils,
)

pytestmark = pytest.mark.db


NOW = datetime.now(UTC)
LATER = NOW + timedelta(hours=1)
MUCH_LATER = NOW + timedelta(hours=2)


class SqlAdder:
    """add_job / remove_job as a SQL caller (a trigger, psql) uses them."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def add(self, identifier: str, payload: Any = None, **options: Any) -> dict[str, Any]:
        args = ["identifier => %(identifier)s", "payload => %(payload)s::json"]
        params: dict[str, Any] = {
            "identifier": identifier,
            "payload": json.dumps(payload) if payload is not None else None,
        }
        for name, val in options.items():
            args.append(f"{name} => %({name})s")
            params[name] = val
        query = f"select * from graphile_worker.add_job({', '.join(args)})"
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(query, params)  # type: ignore[call-overload]
            row = await cur.fetchone()
        assert row is not None
        return dict(row)

    async def remove(self, key: str) -> dict[str, Any] | None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.cursor(row_factory=dict_row).execute(
                "select * from graphile_worker.remove_job(%s) where id is not null", (key,)
            )
            row = await cur.fetchone()
        return dict(row) if row else None


class PythonAdder:
    """The same through WorkerUtils."""

    def __init__(self, utils: WorkerUtils) -> None:
        self.utils = utils

    async def add(self, identifier: str, payload: Any = None, **options: Any) -> dict[str, Any]:
        return (await self.utils.add_job(identifier, payload, **options))._asdict()

    async def remove(self, key: str) -> dict[str, Any] | None:
        job = await self.utils.remove_job(key)
        return job._asdict() if job else None


@pytest.fixture(params=["sql", "python"])
async def adder(request: pytest.FixtureRequest, db: str) -> AsyncIterator[SqlAdder | PythonAdder]:
    if request.param == "sql":
        yield SqlAdder(db)
    else:
        async with make_worker_utils(connection_string=db) as utils:
            yield PythonAdder(utils)


def job(db: str, job_id: int) -> dict[str, Any]:
    return rows(db, "select * from graphile_worker._private_jobs where id = %s", (job_id,))[0]


def all_jobs(db: str) -> list[dict[str, Any]]:
    return rows(db, "select * from graphile_worker._private_jobs order by id")


def lock(db: str, job_id: int, *, age: timedelta = timedelta(0)) -> None:
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now() - %s, locked_by = 'pool-test', "
        "attempts = attempts + 1 where id = %s",
        (age, job_id),
    )


def fail(db: str, job_id: int, *, permanently: bool = False) -> None:
    rows(
        db,
        "update graphile_worker._private_jobs set last_error = 'boom', "
        "attempts = case when %s then max_attempts else attempts + 1 end where id = %s",
        (permanently, job_id),
    )


async def test_replace_updates_the_pending_job(adder, db: str) -> None:
    first = await adder.add("send_email", {"count": 1}, job_key="abc", run_at=LATER, priority=3)
    second = await adder.add(
        "send_email",
        {"count": 2},
        job_key="abc",
        run_at=MUCH_LATER,
        queue_name="mail",
        max_attempts=3,
        flags=["x"],
    )
    assert second["id"] == first["id"]
    [row] = all_jobs(db)
    assert row["payload"] == {"count": 2}
    assert row["run_at"] == MUCH_LATER
    assert row["priority"] == 0  # every attribute takes its new value
    assert row["max_attempts"] == 3 and row["flags"] == {"x": True}
    assert row["revision"] == 1
    assert value(db, "select queue_name from graphile_worker.jobs") == "mail"


async def test_replace_can_change_the_task(adder, db: str) -> None:
    first = await adder.add("task_a", {}, job_key="k")
    await adder.add("task_b", {}, job_key="k")
    assert rows(db, "select id, task_identifier from graphile_worker.jobs") == [
        {"id": first["id"], "task_identifier": "task_b"}
    ]


async def test_revision_counts_every_update(adder, db: str) -> None:
    for n in range(4):
        last = await adder.add("t", {"n": n}, job_key="rev")
    assert last["revision"] == 3
    assert len(all_jobs(db)) == 1


async def test_replace_of_a_failed_job_resets_attempts_and_error(adder, db: str) -> None:
    first = await adder.add("t", {"n": 1}, job_key="k", run_at=LATER)
    fail(db, first["id"])
    await adder.add("t", {"n": 2}, job_key="k", run_at=MUCH_LATER)
    row = job(db, first["id"])
    assert (row["attempts"], row["last_error"], row["run_at"]) == (0, None, MUCH_LATER)


async def test_preserve_run_at_keeps_run_at_of_a_fresh_job(adder, db: str) -> None:
    first = await adder.add(
        "t", {"n": 1}, job_key="k", job_key_mode="preserve_run_at", run_at=LATER
    )
    second = await adder.add(
        "t", {"n": 2}, job_key="k", job_key_mode="preserve_run_at", run_at=MUCH_LATER, priority=5
    )
    row = job(db, first["id"])
    assert second["id"] == first["id"]
    assert row["run_at"] == LATER
    assert row["payload"] == {"n": 2} and row["priority"] == 5 and row["revision"] == 1


async def test_preserve_run_at_does_not_hold_for_a_previously_failed_job(adder, db: str) -> None:
    first = await adder.add("t", {}, job_key="k", job_key_mode="preserve_run_at", run_at=LATER)
    fail(db, first["id"])
    await adder.add("t", {}, job_key="k", job_key_mode="preserve_run_at", run_at=MUCH_LATER)
    row = job(db, first["id"])
    assert row["run_at"] == MUCH_LATER
    assert row["attempts"] == 0 and row["last_error"] is None


@pytest.mark.parametrize("lock_age", [timedelta(0), timedelta(hours=5)])
@pytest.mark.parametrize("mode", ["replace", "preserve_run_at"])
async def test_locked_job_loses_its_key_and_a_new_job_is_added(
    adder, db: str, mode: str, lock_age: timedelta
) -> None:
    first = await adder.add("t", {"n": 1}, job_key="k", job_key_mode=mode)
    lock(db, first["id"], age=lock_age)
    rows(
        db,
        "update graphile_worker._private_jobs set last_error = 'was running' where id = %s",
        (first["id"],),
    )
    second = await adder.add("t", {"n": 2}, job_key="k", job_key_mode=mode)
    assert second["id"] != first["id"]
    old = job(db, first["id"])
    assert old["key"] is None
    assert old["attempts"] == old["max_attempts"]
    assert old["last_error"] == "was running"
    assert old["locked_by"] == "pool-test"  # the running job is left to finish
    new = job(db, second["id"])
    assert (new["key"], new["payload"], new["revision"], new["attempts"]) == ("k", {"n": 2}, 0, 0)


async def test_permanently_failed_job_loses_its_key_and_a_new_job_is_added(adder, db: str) -> None:
    first = await adder.add("t", {"n": 1}, job_key="k")
    fail(db, first["id"], permanently=True)
    second = await adder.add("t", {"n": 2}, job_key="k")
    assert second["id"] != first["id"]
    old = job(db, first["id"])
    assert old["key"] is None and old["last_error"] == "boom"
    assert job(db, second["id"])["key"] == "k"


@pytest.mark.parametrize("state", ["pending", "locked", "permanently_failed"])
async def test_unsafe_dedupe_returns_the_existing_job(adder, db: str, state: str) -> None:
    first = await adder.add("t", {"n": 1}, job_key="k", run_at=LATER, priority=2)
    if state == "locked":
        lock(db, first["id"])
    elif state == "permanently_failed":
        fail(db, first["id"], permanently=True)
    before = job(db, first["id"])
    again = await adder.add(
        "t", {"n": 2}, job_key="k", job_key_mode="unsafe_dedupe", run_at=MUCH_LATER, priority=9
    )
    assert again["id"] == first["id"]
    after = job(db, first["id"])
    assert len(all_jobs(db)) == 1
    assert after["revision"] == before["revision"] + 1
    assert after["updated_at"] > before["updated_at"]
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {"revision", "updated_at"}


async def test_unsafe_dedupe_inserts_when_no_job_has_the_key(adder, db: str) -> None:
    added = await adder.add("t", [1], job_key="new", job_key_mode="unsafe_dedupe", queue_name="q")
    assert added["revision"] == 0 and added["payload"] == [1]
    assert value(db, "select queue_name from graphile_worker.jobs") == "q"


async def test_array_payloads_are_concatenated(adder, db: str) -> None:
    await adder.add("batch", [{"id": 1}], job_key="b", job_key_mode="preserve_run_at", run_at=LATER)
    await adder.add(
        "batch", [{"id": 2}], job_key="b", job_key_mode="preserve_run_at", run_at=MUCH_LATER
    )
    await adder.add("batch", [{"id": 3}], job_key="b")
    [row] = all_jobs(db)
    assert row["payload"] == [{"id": 1}, {"id": 2}, {"id": 3}]


@pytest.mark.parametrize("old,new", [([1], {"a": 1}), ({"a": 1}, [1]), ({"a": 1}, {"b": 2})])
async def test_non_array_payloads_are_replaced(adder, db: str, old: Any, new: Any) -> None:
    await adder.add("t", old, job_key="k")
    await adder.add("t", new, job_key="k")
    assert all_jobs(db)[0]["payload"] == new


async def test_remove_job_deletes_a_pending_job(adder, db: str) -> None:
    added = await adder.add("t", {}, job_key="gone")
    removed = await adder.remove("gone")
    assert removed is not None and removed["id"] == added["id"]
    assert all_jobs(db) == []
    assert await adder.remove("gone") is None


async def test_remove_job_on_a_locked_job_stops_its_retries(adder, db: str) -> None:
    added = await adder.add("t", {}, job_key="busy")
    lock(db, added["id"])
    removed = await adder.remove("busy")
    assert removed is not None
    row = job(db, added["id"])
    assert row["key"] is None and row["attempts"] == row["max_attempts"]
    assert row["locked_by"] == "pool-test"


async def test_remove_job_deletes_a_job_locked_over_4_hours_ago(adder, db: str) -> None:
    added = await adder.add("t", {}, job_key="stale")
    lock(db, added["id"], age=timedelta(hours=4, minutes=1))
    await adder.remove("stale")
    assert all_jobs(db) == []


async def test_defaults_flags_and_queues(adder, db: str) -> None:
    plain = await adder.add("t")
    assert (
        plain["payload"],
        plain["priority"],
        plain["max_attempts"],
        plain["key"],
        plain["flags"],
    ) == ({}, 0, 25, None, None)
    assert plain["job_queue_id"] is None
    empty_flags = await adder.add("t", {}, flags=[])
    assert empty_flags["flags"] is None
    flagged = await adder.add("t", {}, flags=["a", "b"])
    assert flagged["flags"] == {"a": True, "b": True}


async def test_existing_tasks_and_queues_do_not_consume_identity_values(adder, db: str) -> None:
    for _ in range(5):
        await adder.add("same_task", {}, queue_name="same_queue")
    await adder.add("other_task", {}, queue_name="other_queue")
    assert rows(db, "select id, identifier from graphile_worker._private_tasks order by id") == [
        {"id": 1, "identifier": "same_task"},
        {"id": 2, "identifier": "other_task"},
    ]
    assert value(db, "select max(id) from graphile_worker._private_job_queues") == 2


async def test_add_job_notifies_jobs_insert(adder, db: str) -> None:
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as listener:
        await listener.execute('listen "jobs:insert"')
        await adder.add("t", {}, job_key="n")
        await adder.add("t", {}, job_key="n", job_key_mode="unsafe_dedupe")  # no insert: silent
        await adder.remove("n")
        payloads = [
            json.loads(n.payload) async for n in listener.notifies(timeout=1.0, stop_after=3)
        ]
    assert [p["count"] for p in payloads] == [1, -1]
    assert all(isinstance(p["r"], float) for p in payloads)


async def test_invalid_job_key_mode_from_sql_raises_gwbkm(db: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        rows(db, "select graphile_worker.add_job('t', job_key => 'k', job_key_mode => 'bogus')")
    assert info.value.sqlstate == "GWBKM"
    # Without a job_key the mode is not looked at, as in Node.
    rows(db, "select graphile_worker.add_job('t', job_key_mode => 'bogus')")
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 1


async def test_invalid_job_key_mode_from_python_names_the_field(
    utils: WorkerUtils, db: str
) -> None:
    with pytest.raises(JobSpecError, match="job_key_mode: 'bogus' is not one of replace"):
        await utils.add_job("t", {}, job_key="k", job_key_mode="bogus")  # type: ignore[arg-type]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_add_jobs_applies_job_keys_and_preserve_run_at(utils: WorkerUtils, db: str) -> None:
    first = await utils.add_job("t", [1], job_key="k", run_at=LATER)
    jobs = await utils.add_jobs(
        [
            {"identifier": "t", "payload": [2], "job_key": "k", "run_at": MUCH_LATER},
            {"identifier": "u", "payload": {"x": 1}, "queue_name": "q", "priority": -1},
        ],
        job_key_preserve_run_at=True,
    )
    by_task = {j.task_identifier: j for j in jobs}
    assert by_task["t"].id == first.id and by_task["t"].payload == [1, 2]
    assert by_task["t"].run_at == LATER and by_task["t"].revision == 1
    assert by_task["u"].queue_name == "q" and by_task["u"].priority == -1


async def test_add_jobs_notifies_with_the_spec_count(utils: WorkerUtils, db: str) -> None:
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as listener:
        await listener.execute('listen "jobs:insert"')
        await utils.add_jobs([{"identifier": "t", "payload": {"n": n}} for n in range(7)])
        payloads = [
            json.loads(n.payload) async for n in listener.notifies(timeout=1.0, stop_after=2)
        ]
    assert [p["count"] for p in payloads] == [7]


# --- The job's own options (timeout=) follow the same rules -------------------------
#
# replace and preserve_run_at make the job what the latest call says (no
# timeout given: none any more); unsafe_dedupe leaves an existing job as it
# was; a running job keeps its options and the call's new job gets the call's.

OPTIONS = "graphile_worker._private_py_job_options"
JOBS = "select 1 from graphile_worker._private_jobs"


def own_timeout(db: str, job_id: int) -> timedelta | None:
    """The job's own timeout, as the worker's fetch returns it with the job."""
    return value(db, f"select timeout from {OPTIONS} where job_id = %s", (job_id,))  # type: ignore[no-any-return]


class Facade:
    """add_job / add_jobs through WorkerUtils or SyncWorkerUtils."""

    def __init__(self, utils: WorkerUtils | SyncWorkerUtils) -> None:
        self.utils = utils

    async def add_job(self, *args: Any, **options: Any) -> Any:
        added = self.utils.add_job(*args, **options)
        return await added if isinstance(self.utils, WorkerUtils) else added

    async def add_jobs(self, *args: Any, **options: Any) -> Any:
        added = self.utils.add_jobs(*args, **options)
        return await added if isinstance(self.utils, WorkerUtils) else added


@pytest.fixture(params=["async", "sync"])
async def facade(request: pytest.FixtureRequest, db: str) -> AsyncIterator[Facade]:
    if request.param == "async":
        async with make_worker_utils(connection_string=db) as utils:
            yield Facade(utils)
    else:
        with make_sync_worker_utils(connection_string=db) as sync:
            yield Facade(sync)


@pytest.mark.parametrize("mode", ["replace", "preserve_run_at"])
async def test_replace_gives_the_job_the_latest_calls_timeout_or_none(
    facade: Facade, db: str, mode: str
) -> None:
    timed = await facade.add_job("t", {}, job_key="a", timeout=60)
    untimed = await facade.add_job("t", {}, job_key="a", job_key_mode=mode)
    assert untimed.id == timed.id and own_timeout(db, timed.id) is None
    again = await facade.add_job("t", {}, job_key="a", job_key_mode=mode, timeout=30)
    assert again.id == timed.id and own_timeout(db, timed.id) == timedelta(seconds=30)
    # add_jobs replaces too: a spec without a timeout leaves the job none.
    batch = await facade.add_jobs(
        [{"identifier": "t", "job_key": "a"}, {"identifier": "t", "job_key": "b", "timeout": 9}],
        job_key_preserve_run_at=mode == "preserve_run_at",
    )
    assert batch[0].id == timed.id and own_timeout(db, timed.id) is None
    replaced = await facade.add_jobs(
        [{"identifier": "t", "job_key": "b"}],
        job_key_preserve_run_at=mode == "preserve_run_at",
    )
    assert replaced[0].id == batch[1].id and own_timeout(db, batch[1].id) is None
    # A unique add that adds (no conflict) replaces by its key the same way.
    unique = await facade.add_job("t", {"u": 1}, job_key="a", job_key_mode=mode, unique={})
    assert unique.job_id == timed.id and not unique.conflict
    await facade.add_job("t", {}, job_key="a", timeout=5)
    [spec] = await facade.add_jobs(
        [{"identifier": "t", "payload": {"u": 2}, "job_key": "a"}], unique=[{}]
    )
    assert spec.job_id == timed.id and own_timeout(db, timed.id) is None


async def test_unsafe_dedupe_leaves_the_existing_jobs_timeout_as_it_was(
    facade: Facade, db: str
) -> None:
    timed = await facade.add_job("t", {}, job_key="a", timeout=60)
    untimed = await facade.add_job("t", {}, job_key="b")
    for job_key, kept in ((timed, timedelta(seconds=60)), (untimed, None)):
        again = await facade.add_job(
            "t", {}, job_key=job_key.key, job_key_mode="unsafe_dedupe", timeout=30
        )
        assert again.id == job_key.id and again.revision == 1
        assert own_timeout(db, job_key.id) == kept
        # Without a timeout: still as it was.
        await facade.add_job("t", {}, job_key=job_key.key, job_key_mode="unsafe_dedupe")
        assert own_timeout(db, job_key.id) == kept
    # A job the call adds has the call's timeout.
    added = await facade.add_job("t", {}, job_key="c", job_key_mode="unsafe_dedupe", timeout=7)
    assert added.revision == 0 and own_timeout(db, added.id) == timedelta(seconds=7)


@pytest.mark.parametrize("mode", ["replace", "preserve_run_at", "unsafe_dedupe"])
async def test_a_running_job_keeps_its_options_and_the_calls_new_job_has_the_calls(
    facade: Facade, db: str, mode: str
) -> None:
    running = await facade.add_job("t", {}, job_key="a", timeout=60)
    other = await facade.add_job("t", {}, job_key="b", timeout=60)
    lock(db, running.id)
    lock(db, other.id)
    untimed = await facade.add_job("t", {}, job_key="a", job_key_mode=mode)
    timed = await facade.add_job("t", {}, job_key="b", job_key_mode=mode, timeout=30)
    assert own_timeout(db, running.id) == own_timeout(db, other.id) == timedelta(seconds=60)
    if mode == "unsafe_dedupe":  # the running job is the one
        assert (untimed.id, timed.id) == (running.id, other.id)
        return
    # graphile-worker's rule: a new job, the running one loses its key.
    assert untimed.id != running.id and timed.id != other.id
    assert job(db, running.id)["key"] is None
    assert own_timeout(db, untimed.id) is None
    assert own_timeout(db, timed.id) == timedelta(seconds=30)
    [batch] = await facade.add_jobs(
        [{"identifier": "t", "job_key": "c", "timeout": 5}],
        job_key_preserve_run_at=mode == "preserve_run_at",
    )
    lock(db, batch.id)
    [new] = await facade.add_jobs(
        [{"identifier": "t", "job_key": "c"}], job_key_preserve_run_at=mode == "preserve_run_at"
    )
    assert new.id != batch.id and own_timeout(db, new.id) is None
    assert own_timeout(db, batch.id) == timedelta(seconds=5)


async def test_replace_starts_the_snooze_count_again_and_keeps_a_waiter(
    utils: WorkerUtils, db: str
) -> None:
    """The job is the latest call's: its snoozes count from 0, as its attempts
    do; a waiter registered on its id is still told when it finishes."""
    first = await utils.add_job("t", {}, job_key="a", timeout=60)
    snoozed = f"update {OPTIONS} set snoozes = 3, notify_on_finish = true where job_id = %s"
    rows(db, snoozed, (first.id,))
    await utils.add_job("t", {}, job_key="a")
    [row] = rows(db, f"select * from {OPTIONS} where job_id = %s", (first.id,))
    assert (row["timeout"], row["snoozes"], row["notify_on_finish"]) == (None, 0, True)
    rows(db, f"update {OPTIONS} set snoozes = 3 where job_id = %s", (first.id,))
    await utils.add_job("t", {}, job_key="a", timeout=8)
    [row] = rows(db, f"select * from {OPTIONS} where job_id = %s", (first.id,))
    assert (row["timeout"], row["snoozes"], row["notify_on_finish"]) == (
        timedelta(seconds=8),
        0,
        True,
    )


async def test_two_specs_with_one_key_in_a_unique_add_jobs_end_with_the_latest(
    utils: WorkerUtils, db: str
) -> None:
    """A unique add_jobs adds its specs one by one: the second spec with a key
    replaces the job the first added; the job has the second's timeout."""
    for timeouts, expected in (((5, 6), 6), ((5, None), None), ((None, 6), 6)):
        specs = [{"identifier": "t", "job_key": f"k{timeouts}"} for _ in timeouts]
        for spec, timeout in zip(specs, timeouts, strict=True):
            if timeout is not None:
                spec["timeout"] = timeout
        first, second = await utils.add_jobs(specs, unique=[None, None])
        assert first.job_id == second.job_id
        assert own_timeout(db, first.job_id) == (
            timedelta(seconds=expected) if expected is not None else None
        )


async def test_helpers_add_job_follows_the_rules_and_the_worker_uses_the_timeout(
    utils: WorkerUtils, db: str
) -> None:
    """What a user sees: a job whose key call (helpers.add_job, add_jobs) took
    its timeout away, or whose dedupe call gave it one, runs past that
    timeout and succeeds."""
    done: list[int] = []

    async def slow(payload: Any, helpers: Helpers) -> None:
        await asyncio.sleep(1.0)
        done.append(helpers.job.id)

    async def adder(payload: Any, helpers: Helpers) -> None:
        await helpers.add_job("slow", {}, job_key="a")  # replace, no timeout
        await helpers.add_jobs([{"identifier": "slow", "job_key": "b"}])
        await helpers.add_job("slow", {}, job_key="c", job_key_mode="unsafe_dedupe", timeout=0.3)

    far = NOW + timedelta(days=1)  # none runs before the adder's calls
    replaced = await utils.add_job("slow", {}, job_key="a", timeout=0.3, run_at=far)
    batch = await utils.add_job("slow", {}, job_key="b", timeout=0.3, run_at=far)
    deduped = await utils.add_job("slow", {}, job_key="c", run_at=far)
    ids = [replaced.id, batch.id, deduped.id]
    added = await utils.add_job("adder", {}, max_attempts=1)
    unfinished = f"{JOBS} where id = any(%s) and last_error is null"
    async with worker(db, {"slow": slow, "adder": adder}, concurrency=3, poll_interval=0.1):
        await until(lambda: not value(db, f"{JOBS} where id = %s", (added.id,)))
        await utils.reschedule_jobs([deduped.id], run_at=datetime.now(UTC))  # it kept its run_at
        await until(lambda: not rows(db, unfinished, (ids,)), what="the slow jobs")
    assert sorted(done) == sorted(ids)


async def test_keyed_calls_work_in_a_schema_without_the_options_table(db: str) -> None:
    """A schema Node installed has no options table (no job there has a
    timeout): a keyed call without one has nothing to clear and works; once
    the table is there, the same utilities clear a replaced job's timeout."""
    rows(db, f"alter table {OPTIONS} rename to moved_away")
    async with make_worker_utils(connection_string=db) as utils:
        first = await utils.add_job("t", {}, job_key="a")
        assert (await utils.add_job("t", {}, job_key="a")).id == first.id
        [batch] = await utils.add_jobs([{"identifier": "t", "job_key": "a"}])
        [spec] = await utils.add_jobs([{"identifier": "t", "job_key": "a"}], unique=[None])
        assert batch.id == spec.job_id == first.id
        rows(db, f"alter table graphile_worker.moved_away rename to {OPTIONS.split('.')[1]}")
        await utils.add_job("t", {}, job_key="a", timeout=5)
        await utils.add_job("t", {}, job_key="a")
        assert own_timeout(db, first.id) is None
