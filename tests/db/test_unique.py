"""Unique jobs: add_job(unique=...), add_jobs(unique=...) and the SQL py_add_job."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbhelpers import rows, run_cli, value
from node_worker import NodeWorker
from psycopg.rows import dict_row

from worker_cli import (
    Helpers,
    Job,
    JobSpec,
    SchemaNotInstalledError,
    UniqueJobResult,
    UniqueRule,
    UniqueRuleError,
    WorkerUtils,
    make_worker_utils,
    quick_add_job,
    run_once,
)
from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import make_task_list
from worker_cli.worker import WorkerPool

LOCKS = "graphile_worker._private_py_unique_locks"


def job_count(db: str) -> int:
    return int(value(db, "select count(*) from graphile_worker._private_jobs"))


def lock_count(db: str) -> int:
    return int(value(db, f"select count(*) from {LOCKS}"))


async def fail_once(db: str) -> None:
    """Run every job of task "flaky" once with a worker; each attempt fails."""

    async def flaky(payload: Any, helpers: Helpers) -> None:
        raise RuntimeError("not this time")

    await run_once(db, task_list={"flaky": flaky}, no_handle_signals=True)


async def succeed(db: str, task: str = "t") -> None:
    """Run every due job of ``task`` with a worker, successfully."""
    await run_once(db, task_list={task: lambda payload, helpers: None}, no_handle_signals=True)


# --- the rule and its defaults -------------------------------------------------


@pytest.mark.unit
def test_rule_defaults() -> None:
    assert UniqueRule().to_json() == {
        "period": 60.0,
        "by": ["payload", "queue", "task"],
        "keys": None,
        "states": ["pending", "retrying", "running", "succeeded"],
        "until": "success",
        "timestamp": "run_at",
        "replace": [],
    }
    assert UniqueRule.coerce({"period": timedelta(minutes=5)}).to_json()["period"] == 300.0
    assert UniqueRule(period="infinity").to_json()["period"] == "infinity"
    assert UniqueRule(period=float("inf")).to_json()["period"] == "infinity"


@pytest.mark.db
async def test_without_unique_add_job_returns_a_plain_job(utils: WorkerUtils) -> None:
    job = await utils.add_job("t", {"a": 1})
    assert isinstance(job, Job) and job.task_identifier == "t"
    assert [type(j) for j in await utils.add_jobs([{"identifier": "t"}])] == [Job]


@pytest.mark.db
async def test_conflict_flag_and_existing_job(utils: WorkerUtils, db: str) -> None:
    first = await utils.add_job("t", {"a": 1}, unique={"period": 60})
    assert isinstance(first, UniqueJobResult)
    assert first.conflict is False and first.job is not None
    assert first.job_id == first.job.id and first.conflict_state is None
    assert first.job.payload == {"a": 1} and first.job.task_identifier == "t"

    second = await utils.add_job("t", {"a": 1}, unique={"period": 60})
    assert second.conflict is True and second.replaced is False
    assert second.job_id == first.job_id and second.conflict_state == "pending"
    assert second.job is not None and second.job.id == first.job_id
    assert second.job.task_identifier == "t"
    assert job_count(db) == 1


@pytest.mark.db
async def test_default_by_compares_task_queue_and_payload(utils: WorkerUtils, db: str) -> None:
    rule = UniqueRule()
    assert not (await utils.add_job("t", {"a": 1, "b": 2}, unique=rule)).conflict
    # Key order and whitespace of the payload do not matter; flags are not compared.
    assert (await utils.add_job("t", {"b": 2, "a": 1}, flags=["x"], unique=rule)).conflict
    assert not (await utils.add_job("t", {"a": 1, "b": 3}, unique=rule)).conflict
    assert not (await utils.add_job("other", {"a": 1, "b": 2}, unique=rule)).conflict
    assert not (await utils.add_job("t", {"a": 1, "b": 2}, queue_name="q", unique=rule)).conflict
    assert (await utils.add_job("t", {"a": 1, "b": 2}, queue_name="q", unique=rule)).conflict
    assert job_count(db) == 4


@pytest.mark.db
async def test_by_chooses_the_fields(utils: WorkerUtils) -> None:
    task_only = UniqueRule(by=["task"])
    assert not (await utils.add_job("t", {"n": 1}, queue_name="a", unique=task_only)).conflict
    assert (await utils.add_job("t", {"n": 2}, queue_name="b", unique=task_only)).conflict

    with_flags = UniqueRule(by=["task", "flags"])
    assert not (await utils.add_job("f", flags=["x", "y"], unique=with_flags)).conflict
    assert (await utils.add_job("f", flags=["y", "x", "x"], unique=with_flags)).conflict
    assert not (await utils.add_job("f", flags=["x"], unique=with_flags)).conflict
    assert not (await utils.add_job("f", unique=with_flags)).conflict
    # No flags and an empty list are the same (both stored as null).
    assert (await utils.add_job("f", flags=[], unique=with_flags)).conflict


@pytest.mark.db
async def test_keys_compare_part_of_the_payload(utils: WorkerUtils) -> None:
    rule = UniqueRule(keys=["user"])
    first = await utils.add_job("mail", {"user": 7, "text": "hi"}, unique=rule)
    assert not first.conflict
    assert (await utils.add_job("mail", {"text": "other", "user": 7}, unique=rule)).conflict
    assert not (await utils.add_job("mail", {"user": 8, "text": "hi"}, unique=rule)).conflict
    # A missing key differs from a key whose value is null.
    assert not (await utils.add_job("mail", {"text": "hi"}, unique=rule)).conflict
    assert not (await utils.add_job("mail", {"user": None}, unique=rule)).conflict
    assert (await utils.add_job("mail", {"user": None, "x": 1}, unique=rule)).conflict


# --- states --------------------------------------------------------------------


@pytest.mark.db
async def test_pending_scheduled_job_blocks(utils: WorkerUtils) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    assert not (await utils.add_job("t", run_at=later, unique={"period": 60})).conflict
    result = await utils.add_job("t", unique={"period": 60})
    assert result.conflict and result.conflict_state == "pending"


@pytest.mark.db
async def test_running_job_blocks_with_until_success_but_not_until_start(
    utils: WorkerUtils, db: str
) -> None:
    seen: dict[str, UniqueJobResult] = {}

    async def job(payload: dict[str, str], helpers: Helpers) -> None:
        # The first job of each rule adds a duplicate of itself while it runs.
        if payload["until"] not in seen:
            rule = UniqueRule(until=payload["until"])  # type: ignore[arg-type]
            seen[payload["until"]] = await helpers.add_job("job", payload, unique=rule)

    await utils.add_job("job", {"until": "success"}, unique=UniqueRule(until="success"))
    await utils.add_job("job", {"until": "start"}, unique=UniqueRule(until="start"))
    await run_once(db, task_list={"job": job}, no_handle_signals=True, concurrency=1)
    assert seen["success"].conflict and seen["success"].conflict_state == "running"
    assert not seen["start"].conflict
    # The duplicate added under until=start ran too.
    assert job_count(db) == 0


@pytest.mark.db
async def test_states_without_running(utils: WorkerUtils, db: str) -> None:
    seen: list[UniqueJobResult] = []

    async def job(payload: Any, helpers: Helpers) -> None:
        if not seen:
            seen.append(await helpers.add_job("job", {}, unique={"states": ["pending"]}))

    await utils.add_job("job", {}, unique={"states": ["pending"]})
    await run_once(db, task_list={"job": job}, no_handle_signals=True)
    assert seen[0].conflict is False


@pytest.mark.db
async def test_failing_job_holds_until_success_lock_through_retries(
    utils: WorkerUtils, db: str
) -> None:
    success = UniqueRule(until="success")
    start = UniqueRule(until="start")
    held = await utils.add_job("flaky", {"n": 1}, max_attempts=3, unique=success)
    released = await utils.add_job("flaky", {"n": 2}, max_attempts=3, unique=start)
    await fail_once(db)
    assert {
        r["id"]: r["attempts"] for r in rows(db, "select id, attempts from graphile_worker.jobs")
    } == {
        held.job_id: 1,
        released.job_id: 1,
    }

    retrying = await utils.add_job("flaky", {"n": 1}, unique=success)
    assert retrying.conflict and retrying.conflict_state == "retrying"
    assert retrying.job is not None and retrying.job.last_error == "RuntimeError: not this time"
    again = await utils.add_job("flaky", {"n": 2}, unique=start)
    assert not again.conflict and again.job_id != released.job_id


@pytest.mark.db
async def test_permanently_failed_job_blocks_only_when_failed_is_listed(
    utils: WorkerUtils, db: str
) -> None:
    first = await utils.add_job("flaky", {"n": 1}, max_attempts=1, unique={})
    listed = await utils.add_job(
        "flaky", {"n": 2}, max_attempts=1, unique={"states": ["pending", "failed"]}
    )
    await fail_once(db)

    by_default = await utils.add_job("flaky", {"n": 1}, unique={})
    assert not by_default.conflict and by_default.job_id != first.job_id
    blocked = await utils.add_job("flaky", {"n": 2}, unique={"states": ["pending", "failed"]})
    assert blocked.conflict and blocked.conflict_state == "failed"
    assert blocked.job_id == listed.job_id


@pytest.mark.db
async def test_succeeded_job_blocks_for_the_rest_of_the_period(utils: WorkerUtils, db: str) -> None:
    first = await utils.add_job("t", {"n": 1}, unique={"period": 60})
    faktory = await utils.add_job(
        "t", {"n": 2}, unique={"period": 60, "states": ["pending", "running", "retrying"]}
    )
    await succeed(db)
    assert job_count(db) == 0

    blocked = await utils.add_job("t", {"n": 1}, unique={"period": 60})
    # The job's row is gone: no job to return, but its id and the reason.
    assert blocked.conflict and blocked.conflict_state == "succeeded"
    assert blocked.job is None and blocked.job_id == first.job_id
    added = await utils.add_job(
        "t", {"n": 2}, unique={"period": 60, "states": ["pending", "running", "retrying"]}
    )
    assert not added.conflict and added.job_id != faktory.job_id


@pytest.mark.db
async def test_infinity_blocks_while_the_job_exists_and_not_after_success(
    utils: WorkerUtils, db: str
) -> None:
    rule = UniqueRule(period="infinity")
    first = await utils.add_job("t", {}, unique=rule)
    assert value(db, f"select expires_at from {LOCKS}") is None
    assert (await utils.add_job("t", {}, unique=rule)).conflict
    await succeed(db)
    second = await utils.add_job("t", {}, unique=rule)
    assert not second.conflict and second.job_id != first.job_id


# --- period and timestamp --------------------------------------------------------


def lock_of(db: str, job_id: int) -> dict[str, Any]:
    [lock] = rows(db, f"select created_at, expires_at from {LOCKS} where job_id = %s", (job_id,))
    return lock


def time_passes(db: str, seconds: float) -> None:
    """Stand for ``seconds`` going by: every lock was taken, and runs out, that much
    earlier (a lock's ``expires_at`` against ``now()`` is all uniqueness reads of time)."""
    rows(
        db,
        f"update {LOCKS} set created_at = created_at - make_interval(secs => %(s)s), "
        "expires_at = expires_at - make_interval(secs => %(s)s)",
        {"s": seconds},
    )


@pytest.mark.db
async def test_period_expiry(utils: WorkerUtils, db: str) -> None:
    rule = {"period": 600}
    first = await utils.add_job("t", {}, unique=rule)
    lock = lock_of(db, first.job_id)  # from when it was added: the job is due at once
    assert lock["expires_at"] == lock["created_at"] + timedelta(seconds=600)
    assert (await utils.add_job("t", {}, unique=rule)).conflict
    time_passes(db, 600)
    # The first job is still pending, but the period is over.
    second = await utils.add_job("t", {}, unique=rule)
    assert not second.conflict and second.job_id != first.job_id
    assert job_count(db) == 2
    lock = lock_of(db, second.job_id)
    assert lock["expires_at"] == lock["created_at"] + timedelta(seconds=600)
    assert (await utils.add_job("t", {}, unique=rule)).job_id == second.job_id


@pytest.mark.db
async def test_scheduled_job_is_unique_for_its_delay_plus_the_period(
    utils: WorkerUtils, db: str
) -> None:
    # Added at t0, due at t0+20 min, period 10 min: from run_at it blocks until
    # t0+30 min, from when it was added until t0+10 min.
    t0 = value(db, "select now()")
    soon = t0 + timedelta(minutes=20)
    from_run_at = UniqueRule(period=600)
    from_added = UniqueRule(period=600, timestamp="added")
    by_run_at = await utils.add_job("t", {"n": 1}, run_at=soon, unique=from_run_at)
    by_added = await utils.add_job("t", {"n": 2}, run_at=soon, unique=from_added)
    assert lock_of(db, by_run_at.job_id)["expires_at"] == soon + timedelta(minutes=10)
    lock = lock_of(db, by_added.job_id)
    assert lock["expires_at"] == lock["created_at"] + timedelta(minutes=10)
    time_passes(db, 25 * 60)  # t0+25 min: past run_at, within run_at + the period
    assert (await utils.add_job("t", {"n": 1}, unique=from_run_at)).conflict
    assert not (await utils.add_job("t", {"n": 2}, unique=from_added)).conflict
    time_passes(db, 5 * 60)  # t0+30 min
    assert not (await utils.add_job("t", {"n": 1}, unique=from_run_at)).conflict

    much_later = datetime.now(UTC) + timedelta(days=2)
    job = (await utils.add_job("t", {"n": 3}, run_at=much_later, unique=from_run_at)).job
    assert job is not None
    expires = value(db, f"select expires_at from {LOCKS} where job_id = %s", (job.id,))
    assert expires == job.run_at + timedelta(minutes=10)


# --- replace -----------------------------------------------------------------------


@pytest.mark.db
async def test_replace_updates_a_pending_job(utils: WorkerUtils, db: str) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    rule = UniqueRule(
        by=["task", "payload"], keys=["id"], replace=["run_at", "priority", "payload", "queue"]
    )
    first = await utils.add_job("t", {"id": 1, "v": "old"}, run_at=later, unique=rule)
    sooner = datetime.now(UTC) + timedelta(minutes=5)
    second = await utils.add_job(
        "t", {"id": 1, "v": "new"}, run_at=sooner, priority=-5, queue_name="q", unique=rule
    )
    assert second.conflict and second.replaced and second.job is not None
    assert second.job.id == first.job_id
    assert second.job.payload == {"id": 1, "v": "new"}
    assert (second.job.run_at, second.job.priority, second.job.queue_name) == (sooner, -5, "q")
    assert second.job.max_attempts == 25 and second.job.revision == 1
    # The lock now counts from the new run_at.
    expires = value(db, f"select expires_at from {LOCKS}")
    assert expires == sooner + timedelta(seconds=60)

    # Listed fields take this call's values, defaults included; the others are kept.
    third = await utils.add_job("t", {"id": 1}, max_attempts=3, unique=rule)
    assert third.replaced and third.job is not None
    assert third.job.max_attempts == 25 and third.job.priority == 0


@pytest.mark.db
async def test_replace_leaves_a_job_that_is_not_pending_alone(utils: WorkerUtils, db: str) -> None:
    rule = UniqueRule(replace=["priority", "max_attempts"])
    first = await utils.add_job("flaky", {}, max_attempts=5, unique=rule)
    await fail_once(db)
    result = await utils.add_job("flaky", {}, priority=9, max_attempts=2, unique=rule)
    assert result.conflict and result.conflict_state == "retrying" and not result.replaced
    assert result.job is not None and result.job.id == first.job_id
    assert (result.job.priority, result.job.max_attempts) == (0, 5)


# --- the guarantees ------------------------------------------------------------------


@pytest.mark.db
async def test_50_concurrent_connections_add_one_job(db: str) -> None:
    connections = [await psycopg.AsyncConnection.connect(db, autocommit=True) for _ in range(50)]
    try:
        start = asyncio.Event()

        async def add(conn: psycopg.AsyncConnection[Any]) -> tuple[int, bool]:
            await start.wait()
            cur = await conn.execute(
                "select job_id, conflict from graphile_worker.py_add_job("
                "'race', '{\"n\": 1}', unique_rule => '{\"period\": 60}')"
            )
            row = await cur.fetchone()
            assert row is not None
            return row[0], row[1]

        tasks = [asyncio.create_task(add(conn)) for conn in connections]
        await asyncio.sleep(0.1)
        start.set()
        results = await asyncio.gather(*tasks)
    finally:
        for conn in connections:
            await conn.close()
    assert sorted(conflict for _, conflict in results) == [False] + [True] * 49
    assert len({job_id for job_id, _ in results}) == 1
    assert job_count(db) == 1 and lock_count(db) == 1


@pytest.mark.db
async def test_50_concurrent_python_callers_add_one_job(db: str) -> None:
    async with make_worker_utils(connection_string=db, max_pool_size=50) as utils:
        results = await asyncio.gather(
            *(utils.add_job("race", {"n": 2}, unique={"period": 60}) for _ in range(50))
        )
    assert sorted(result.conflict for result in results) == [False] + [True] * 49
    assert len({result.job_id for result in results}) == 1
    assert job_count(db) == 1


@pytest.mark.db
@pytest.mark.node
async def test_job_completed_by_node_releases_the_lock(
    utils: WorkerUtils, db: str, node: NodeWorker, tmp_path: Path
) -> None:
    tasks = tmp_path / "node_worker" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "t.cjs").write_text("module.exports = async () => {};\n")
    faktory = UniqueRule(until="success", states=["pending", "running", "retrying"])
    oban = UniqueRule(until="success")
    first = await utils.add_job("t", {"n": 1}, unique=faktory)
    second = await utils.add_job("t", {"n": 2}, unique=oban)
    assert (await utils.add_job("t", {"n": 1}, unique=faktory)).conflict

    result = node.run("-c", db, "--once", cwd=tasks.parent)
    assert result.returncode == 0, result.stderr
    assert job_count(db) == 0

    # Node deleted the rows, which is how success shows.
    released = await utils.add_job("t", {"n": 1}, unique=faktory)
    assert not released.conflict and released.job_id != first.job_id
    blocked = await utils.add_job("t", {"n": 2}, unique=oban)
    assert blocked.conflict and blocked.conflict_state == "succeeded"
    assert blocked.job_id == second.job_id


@pytest.mark.db
async def test_jobs_without_unique_leave_no_trace(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("t", {})
    await utils.add_jobs([{"identifier": "t"}])
    rows(db, "select graphile_worker.py_add_job('t', unique_rule => null)")
    assert lock_count(db) == 0 and job_count(db) == 3


# --- add_jobs ----------------------------------------------------------------------------


@pytest.mark.db
async def test_add_jobs_with_one_rule(utils: WorkerUtils, db: str) -> None:
    existing = await utils.add_job("t", {"n": 0}, unique={})
    results = await utils.add_jobs(
        [
            {"identifier": "t", "payload": {"n": 1}},
            JobSpec(identifier="t", payload={"n": 0}),
            {"identifier": "t", "payload": {"n": 2}},
            {"identifier": "t", "payload": {"n": 1}},
        ],
        unique=UniqueRule(period=60),
    )
    # In the order of the specs; the last one conflicts with the first.
    assert [r.conflict for r in results] == [False, True, False, True]
    assert results[1].job_id == existing.job_id and results[3].job_id == results[0].job_id
    assert [r.job.payload if r.job else None for r in results] == [
        {"n": 1},
        {"n": 0},
        {"n": 2},
        {"n": 1},
    ]
    assert job_count(db) == 3


@pytest.mark.db
async def test_add_jobs_with_a_rule_per_spec(utils: WorkerUtils, db: str) -> None:
    results = await utils.add_jobs(
        [
            {"identifier": "t", "payload": {"n": 1}},
            {"identifier": "t", "payload": {"n": 1}},
            {"identifier": "t", "payload": {"n": 1}},
            {"identifier": "t", "payload": {"n": 2, "x": 1}},
            {"identifier": "t", "payload": {"n": 2, "x": 2}},
        ],
        unique=[{}, None, {}, {"keys": ["n"]}, {"keys": ["n"]}],
    )
    assert [r.conflict for r in results] == [False, False, True, False, True]
    assert results[2].job_id == results[0].job_id and results[1].job_id != results[0].job_id
    assert job_count(db) == 3
    with pytest.raises(ValueError, match=r"unique: has 1 rules for 2 specs"):
        await utils.add_jobs([{"identifier": "t"}, {"identifier": "t"}], unique=[{}])
    with pytest.raises(ValueError, match=r"unique\[1\]\.period"):
        await utils.add_jobs([{"identifier": "t"}, {"identifier": "t"}], unique=[{}, {"period": 0}])


@pytest.mark.db
async def test_concurrent_batches_in_different_orders_do_not_deadlock(db: str) -> None:
    specs = [{"identifier": "t", "payload": {"n": n}} for n in range(20)]
    async with make_worker_utils(connection_string=db, max_pool_size=8) as utils:
        batches = await asyncio.gather(
            *(
                utils.add_jobs(specs[::step] + specs, unique={"period": 60})
                for step in (1, -1, 2, -2, 3, -3, 1, -1)
            )
        )
    assert job_count(db) == 20
    for results in batches:
        assert {r.job_id for r in results} == {r.job_id for r in batches[0]}


# --- SQL callers -------------------------------------------------------------------------


@pytest.mark.db
async def test_sql_callers_and_python_callers_share_the_rule(utils: WorkerUtils, db: str) -> None:
    sql_row = rows(
        db,
        "select job_id, conflict, conflict_state, (job).id, (job).payload "
        "from graphile_worker.py_add_job('t', '{\"b\": 1, \"a\": [1, 2]}', "
        "unique_rule => '{\"period\": 60}')",
    )[0]
    assert sql_row["conflict"] is False and sql_row["id"] == sql_row["job_id"]
    python = await utils.add_job("t", {"a": [1, 2], "b": 1}, unique={"period": 60})
    assert python.conflict and python.job_id == sql_row["job_id"]
    again = rows(
        db,
        "select job_id, conflict, conflict_state from graphile_worker.py_add_job("
        "'t', '{\"a\":[1,2],\"b\":1}', unique_rule => '{\"period\": 60}')",
    )[0]
    assert again == {"job_id": sql_row["job_id"], "conflict": True, "conflict_state": "pending"}

    batch = rows(
        db,
        "select spec_index, conflict from graphile_worker.py_add_jobs(array["
        "('u', '{}', null, null, null, null, null, null),"
        "('u', '{}', null, null, null, null, null, null)]::graphile_worker.job_spec[]) "
        "order by spec_index",
    )
    assert batch == [{"spec_index": 1, "conflict": False}, {"spec_index": 2, "conflict": True}]


BAD_RULES: list[tuple[dict[str, Any], str]] = [
    ({"period": -1}, r"^unique\.period: must be a positive number"),
    ({"period": 0}, r"^unique\.period: must be a positive number"),
    ({"period": "forever"}, r"^unique\.period: must be a positive number"),
    ({"period": 4e9}, r"^unique\.period: .* more than 100 years"),
    ({"by": ["task", "colour"]}, r"^unique\.by: unknown value\(s\) colour"),
    ({"by": []}, r"^unique\.by: must not be empty"),
    ({"states": ["pending", "lost"]}, r"^unique\.states: unknown value\(s\) lost"),
    ({"states": []}, r"^unique\.states: must not be empty"),
    ({"keys": ["id"], "by": ["task"]}, r'^unique\.keys: .*"by" must include "payload"'),
    ({"keys": []}, r"^unique\.keys: must be a non-empty list"),
    ({"until": "finish"}, r'^unique\.until: must be "success" or "start"'),
    ({"until": "start", "states": ["running"]}, r'^unique\.until: .*must include "pending"'),
    ({"timestamp": "inserted_at"}, r'^unique\.timestamp: must be "run_at" or "added"'),
    ({"replace": ["task"]}, r"^unique\.replace: unknown value\(s\) task"),
    ({"periodd": 5}, r"^unique: unknown field\(s\) periodd"),
]


@pytest.mark.parametrize("rule,message", BAD_RULES)
@pytest.mark.db
async def test_bad_rules_raise_value_error_naming_the_field(
    utils: WorkerUtils, db: str, rule: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        await utils.add_job("t", {}, unique=rule)
    assert isinstance(caught.value, UniqueRuleError)
    with pytest.raises(ValueError, match=message):
        await utils.add_jobs([{"identifier": "t"}], unique=rule)
    # The SQL function checks the same things, with the same words.
    with (
        pytest.raises(psycopg.errors.InvalidParameterValue, match=message.lstrip("^")),
        psycopg.connect(db) as conn,
    ):
        conn.execute(
            "select graphile_worker.py_add_job('t', unique_rule => %s::jsonb)", [json.dumps(rule)]
        )
    assert job_count(db) == 0


@pytest.mark.db
async def test_keys_need_an_object_payload(utils: WorkerUtils, db: str) -> None:
    with pytest.raises(ValueError, match=r"^unique\.keys: .*JSON object, not list"):
        await utils.add_job("t", [1, 2], unique={"keys": ["id"]})
    with pytest.raises(ValueError, match=r"^specs\[0\]\.unique\.keys: .*not list"):
        await utils.add_jobs([{"identifier": "t", "payload": [1]}], unique={"keys": ["id"]})
    with (
        pytest.raises(psycopg.errors.InvalidParameterValue, match=r"unique\.keys: .*not array"),
        psycopg.connect(db) as conn,
    ):
        conn.execute(
            "select graphile_worker.py_add_job('t', '[1]', unique_rule => '{\"keys\": [\"id\"]}')"
        )
    assert job_count(db) == 0


# --- removal and cleanup -------------------------------------------------------------


@pytest.mark.db
async def test_remove_job_releases_the_lock(utils: WorkerUtils, db: str) -> None:
    await utils.add_job("t", {}, job_key="k", unique={})
    await utils.remove_job("k")
    assert lock_count(db) == 0
    assert not (await utils.add_job("t", {}, unique={})).conflict


@pytest.mark.db
async def test_deleted_permanently_failed_job_does_not_count_as_success(
    utils: WorkerUtils, db: str
) -> None:
    failed = await utils.add_job("t", {}, unique={})
    await utils.permanently_fail_jobs([failed.job_id])
    await utils.cleanup(["DELETE_PERMAFAILED_JOBS"])
    assert job_count(db) == 0 and lock_count(db) == 0
    assert not (await utils.add_job("t", {}, unique={})).conflict


@pytest.mark.db
async def test_a_plain_sql_delete_counts_as_success(utils: WorkerUtils, db: str) -> None:
    added = await utils.add_job("t", {}, unique={})
    rows(db, "delete from graphile_worker._private_jobs")
    result = await utils.add_job("t", {}, unique={})
    assert result.conflict and result.conflict_state == "succeeded"
    assert result.job_id == added.job_id


async def make_collectable_locks(utils: WorkerUtils, db: str) -> set[int]:
    """Locks of every kind; returns the ids of the jobs whose lock must stay."""
    await utils.add_job("t", {"n": "expired"}, unique={"period": 0.2})
    gone_infinite = await utils.add_job("t", {"n": "gone-infinite"}, unique={"period": "infinity"})
    gone_faktory = await utils.add_job("t", {"n": "gone"}, unique={"states": ["pending"]})
    gone_oban = await utils.add_job("t", {"n": "gone-oban"}, unique={})
    live = await utils.add_job("t", {"n": "live"}, unique={"period": "infinity"})
    await utils.complete_jobs([gone_infinite.job_id, gone_faktory.job_id, gone_oban.job_id])
    await asyncio.sleep(0.3)
    assert lock_count(db) == 5
    return {gone_oban.job_id, live.job_id}


@pytest.mark.db
async def test_cleanup_deletes_locks_that_can_never_block_again(
    utils: WorkerUtils, db: str
) -> None:
    kept = await make_collectable_locks(utils, db)
    await utils.cleanup(["GC_UNIQUE_LOCKS"])
    assert {r["job_id"] for r in rows(db, f"select job_id from {LOCKS}")} == kept
    # In the default list too.
    rows(db, f"update {LOCKS} set expires_at = now() - interval '1 second'")
    await utils.cleanup()
    assert lock_count(db) == 0


@pytest.mark.db
async def test_cleanup_goes_through_many_locks(utils: WorkerUtils, db: str) -> None:
    await utils.add_jobs(
        [{"identifier": "t", "payload": {"n": n}} for n in range(1200)], unique={"period": 60}
    )
    rows(db, "delete from graphile_worker._private_jobs")
    rows(db, f"update {LOCKS} set expires_at = now()")
    assert await utils.gc_unique_locks() == 1200
    assert lock_count(db) == 0


@pytest.mark.db
async def test_cli_cleanup_gc_unique_locks(utils: WorkerUtils, db: str) -> None:
    kept = await make_collectable_locks(utils, db)
    result = run_cli("-c", db, "--cleanup", "GC_UNIQUE_LOCKS")
    assert result.returncode == 0, result.stderr
    assert {r["job_id"] for r in rows(db, f"select job_id from {LOCKS}")} == kept


@pytest.mark.db
async def test_the_worker_sweep_deletes_expired_locks(utils: WorkerUtils, db: str) -> None:
    kept = await make_collectable_locks(utils, db)
    options = WorkerOptions(stale_sweep_interval=(0.05, 0.1))
    pool = WorkerPool(db, make_task_list({"other": lambda payload, helpers: None}), options)
    running = asyncio.create_task(pool.run())
    try:
        for _ in range(200):  # up to 10 s
            if lock_count(db) == len(kept):
                break
            await asyncio.sleep(0.05)
    finally:
        pool.stop()
        await running
    assert {r["job_id"] for r in rows(db, f"select job_id from {LOCKS}")} == kept


@pytest.mark.db
async def test_our_tables_stay_out_of_nodes_migrations(db: str) -> None:
    assert value(db, "select max(id) from graphile_worker.migrations") == 20
    assert 1 in value(db, "select array_agg(id) from graphile_worker._private_py_migrations")
    with psycopg.connect(db) as conn:
        cur = conn.cursor(row_factory=dict_row)
        names = cur.execute(
            "select relname from pg_class "
            "where relnamespace = 'graphile_worker'::regnamespace and relname like '%%unique%%' "
            "order by 1"
        ).fetchall()
    assert [n["relname"] for n in names] == [
        "_private_py_unique_locks",
        "_private_py_unique_locks_expires_at",
        "_private_py_unique_locks_job_id",
        "_private_py_unique_locks_pkey",
    ]


@pytest.mark.db
async def test_quick_add_job_with_unique(db: str) -> None:
    first = await quick_add_job("t", {"n": 1}, connection_string=db, unique={})
    second = await quick_add_job("t", {"n": 1}, connection_string=db, unique={})
    assert not first.conflict and second.conflict and second.job_id == first.job_id


@pytest.mark.db
@pytest.mark.node
async def test_schema_installed_by_node_only(empty_db: str, node: NodeWorker) -> None:
    """Without our migration, everything but unique jobs works as before."""
    result = node.run("-c", empty_db, "--schema-only")
    assert result.returncode == 0, result.stderr
    async with make_worker_utils(connection_string=empty_db) as utils:
        await utils.add_job("t", {}, job_key="k")
        assert (await utils.remove_job("k")) is not None and job_count(empty_db) == 0
        await utils.cleanup(["DELETE_PERMAFAILED_JOBS", "GC_UNIQUE_LOCKS", "GC_JOB_QUEUES"])
        assert await utils.gc_unique_locks() == 0
        with pytest.raises(SchemaNotInstalledError, match=r"py_add_job.*--schema-only"):
            await utils.add_job("t", {}, unique={})
        await utils.migrate()
        assert not (await utils.add_job("t", {}, unique={})).conflict
        assert (await utils.add_job("t", {}, unique={})).conflict
