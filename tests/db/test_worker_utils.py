"""WorkerUtils as a user meets it: input checks, connections, missing schema."""

from __future__ import annotations

import asyncio
import math
import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, value
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool
from workers import until

from worker_cli import (
    ConfigurationError,
    DatabaseConnectionError,
    JobSpec,
    JobSpecError,
    SchemaNotInstalledError,
    WorkerUtils,
    make_worker_utils,
    quick_add_job,
)
from worker_cli.config.options import WorkerOptions
from worker_cli.tasks.loader import load_task_directory
from worker_cli.worker import WorkerPool


def job_count(db: str) -> int:
    return int(value(db, "select count(*) from graphile_worker._private_jobs"))


@pytest.mark.db
async def test_add_job_usage_from_the_issue(db: str) -> None:
    async with make_worker_utils(connection_string=db) as utils:
        job = await utils.add_job("send_email", {"to": "a@b.c"}, queue_name="mail", run_at=None)
    assert (job.task_identifier, job.payload, job.queue_name) == (
        "send_email",
        {"to": "a@b.c"},
        "mail",
    )
    assert (job.attempts, job.max_attempts, job.priority, job.revision) == (0, 25, 0, 0)
    assert rows(db, "select id, task_identifier, queue_name from graphile_worker.jobs") == [
        {"id": job.id, "task_identifier": "send_email", "queue_name": "mail"}
    ]


@pytest.mark.db
async def test_job_is_read_only(utils: WorkerUtils) -> None:
    job = await utils.add_job("t")
    with pytest.raises(AttributeError):
        job.attempts = 3  # type: ignore[misc]


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"identifier": "x" * 129}, r"identifier: is 129 characters long; the limit is 128"),
    ({"identifier": ""}, r"identifier: must not be empty"),
    ({"queue_name": "q" * 129}, r"queue_name: is 129 characters long; the limit is 128"),
    ({"job_key": "k" * 513}, r"job_key: is 513 characters long; the limit is 512"),
    ({"job_key": ""}, r"job_key: must not be empty"),
    ({"max_attempts": 0}, r"max_attempts: is 0; it must be between 1 and 32767"),
    ({"max_attempts": 40000}, r"max_attempts: is 40000; it must be between 1 and 32767"),
    ({"priority": 32768}, r"priority: is 32768; it must be between -32768 and 32767"),
    ({"priority": -32769}, r"priority: is -32769; it must be between -32768 and 32767"),
    ({"priority": "high"}, r"priority: must be an integer, not str"),
    ({"job_key_mode": "merge", "job_key": "k"}, r"job_key_mode: 'merge' is not one of"),
    ({"payload": {"when": datetime.now()}}, r"payload: cannot be encoded as JSON .*datetime"),
    ({"payload": {"x": math.nan}}, r"payload: cannot be encoded as JSON .*Out of range float"),
    ({"payload": {1, 2}}, r"payload: cannot be encoded as JSON .*set"),
    ({"payload": _nested(100_000)}, r"payload: cannot be encoded as JSON .*recursion"),
    ({"run_at": datetime(2030, 1, 1)}, r"run_at: must be timezone-aware"),
    ({"run_at": "tomorrow"}, r"run_at: must be a datetime, not str"),
    # Read back in UTC (or any time zone), these would not be datetimes any more.
    (
        {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-1)))},
        r"run_at: 9999-12-31T23:00:00-01:00 is not from 0001-01-02 to 9999-12-30 \(UTC\)",
    ),
    (
        {"run_at": datetime(1, 1, 1, 12, tzinfo=UTC)},
        r"run_at: 0001-01-01T12:00:00\+00:00 is not from 0001-01-02 to 9999-12-30 \(UTC\)",
    ),
    ({"flags": "abc"}, r"flags: must be a list of strings"),
    # PostgreSQL's text holds no NUL, and psycopg sends only UTF-8: refused
    # before any SQL, naming the field (not a raw DataError or codec error).
    ({"identifier": "a\x00b"}, r"identifier: contains a NUL character \(at 1\)"),
    ({"queue_name": "q\ud800"}, r"queue_name: contains a lone surrogate"),
    ({"job_key": "k\x00"}, r"job_key: contains a NUL character"),
    ({"flags": ["ok", "f\udcff"]}, r"flags: contains a lone surrogate"),
]


@pytest.mark.db
async def test_the_earliest_and_latest_run_at_are_added_and_read_back(utils: WorkerUtils) -> None:
    earliest = datetime(1, 1, 2, tzinfo=UTC)
    latest = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
    assert (await utils.add_job("task", run_at=earliest)).run_at == earliest
    assert (await utils.add_job("task", run_at=latest)).run_at == latest


@pytest.mark.parametrize("options,message", BAD_OPTIONS)
@pytest.mark.db
async def test_bad_add_job_options_name_the_field(
    utils: WorkerUtils, db: str, options: dict[str, Any], message: str
) -> None:
    options = dict(options)
    identifier = options.pop("identifier", "task")
    payload = options.pop("payload", {})
    with pytest.raises(JobSpecError, match=message) as info:
        await utils.add_job(identifier, payload, **options)
    assert isinstance(info.value, ValueError)
    assert job_count(db) == 0


@pytest.mark.parametrize(
    "options,message", [(o, m) for o, m in BAD_OPTIONS if "job_key_mode" not in o]
)
@pytest.mark.db
async def test_bad_add_jobs_specs_name_the_index_and_field(
    utils: WorkerUtils, db: str, options: dict[str, Any], message: str
) -> None:
    spec = {"identifier": "task", **options}
    good = {"identifier": "task", "payload": {"ok": True}}
    with pytest.raises(JobSpecError, match=r"specs\[1\]\." + message):
        await utils.add_jobs([good, spec])
    assert job_count(db) == 0


@pytest.mark.db
async def test_add_jobs_rejects_unknown_fields_and_modes(utils: WorkerUtils) -> None:
    with pytest.raises(JobSpecError, match=r"specs\[0\]: unknown field\(s\) task"):
        await utils.add_jobs([{"identifier": "t", "task": "x"}])
    with pytest.raises(JobSpecError, match=r"specs\[0\]: identifier is required"):
        await utils.add_jobs([{"payload": {}}])
    with pytest.raises(JobSpecError, match=r"job_key_preserve_run_at"):
        await utils.add_jobs([JobSpec(identifier="t", job_key_mode="unsafe_dedupe")])


@pytest.mark.db
async def test_add_jobs_with_spec_objects(utils: WorkerUtils, db: str) -> None:
    when = datetime.now(UTC) + timedelta(minutes=5)
    jobs = await utils.add_jobs(
        [
            JobSpec(identifier="a", payload={"n": 1}, run_at=when, max_attempts=2, flags=["f"]),
            JobSpec(identifier="b", payload=[1, 2], queue_name="q", priority=3, job_key="kb"),
        ]
    )
    by_task = {job.task_identifier: job for job in jobs}
    assert (by_task["a"].run_at, by_task["a"].max_attempts, by_task["a"].flags) == (
        when,
        2,
        {"f": True},
    )
    assert (by_task["b"].queue_name, by_task["b"].priority, by_task["b"].key) == ("q", 3, "kb")
    assert by_task["b"].payload == [1, 2]
    assert await utils.add_jobs([]) == []
    assert job_count(db) == 2


@pytest.mark.db
async def test_payloads_that_are_json_but_not_objects(utils: WorkerUtils) -> None:
    for payload in ("text", 42, [1, "a"], True):
        job = await utils.add_job("t", payload)
        assert job.payload == payload


@pytest.mark.db
async def test_missing_schema_gets_a_clear_error(empty_db: str) -> None:
    async with make_worker_utils(connection_string=empty_db) as utils:
        with pytest.raises(SchemaNotInstalledError, match="graphile-worker --schema-only"):
            await utils.add_job("t", {})
        report = await utils.migrate()
        assert report.revision == 20
        assert (await utils.add_job("t", {})).task_identifier == "t"


@pytest.mark.db
async def test_custom_schema(empty_db: str) -> None:
    async with make_worker_utils(connection_string=empty_db, schema="jobs here") as utils:
        await utils.migrate()
        job = await utils.add_job("t", {"a": 1}, job_key="k")
        assert (await utils.remove_job("k")) == job
    assert value(empty_db, 'select count(*) from "jobs here".migrations') == 20


@pytest.mark.db
async def test_quick_add_job(db: str) -> None:
    job = await quick_add_job("hello", {"name": "Bobby"}, connection_string=db, priority=2)
    assert (job.task_identifier, job.priority) == ("hello", 2)
    assert job_count(db) == 1


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name == "DATABASE_URL" or name.startswith("PG") or name == "GRAPHILE_WORKER_SCHEMA":
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


@pytest.mark.db
async def test_database_url_is_used(db: str, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DATABASE_URL", db)
    await quick_add_job("from_env")
    assert job_count(db) == 1


@pytest.mark.db
async def test_pg_variables_are_used(db: str, clean_env: pytest.MonkeyPatch) -> None:
    params = conninfo_to_dict(db)
    for key, env in (
        ("host", "PGHOST"),
        ("port", "PGPORT"),
        ("dbname", "PGDATABASE"),
        ("user", "PGUSER"),
    ):
        if params.get(key):
            clean_env.setenv(env, str(params[key]))
    await quick_add_job("from_pg_vars")
    assert job_count(db) == 1


@pytest.mark.db
async def test_dotenv_in_working_directory_is_read(
    db: str, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text(f"DATABASE_URL={db}\n")
    await quick_add_job("from_dotenv")
    assert job_count(db) == 1


@pytest.mark.unit
async def test_no_connection_settings_explains_the_three_ways(
    clean_env: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigurationError) as info:
        await quick_add_job("t")
    message = str(info.value)
    assert "-c/--connection" in message and "DATABASE_URL" in message and "PG*" in message


@pytest.mark.db
async def test_refused_connection_is_one_clear_error(pg: Any) -> None:
    # The test servers trust every local login, so a refused login is shown with
    # a database that does not exist: the same libpq failure path as a bad password.
    bad = pg.url("no_such_database_here")
    with pytest.raises(
        DatabaseConnectionError,
        match=r'could not connect to the database: .*"no_such_database_here" does not exist',
    ):
        await quick_add_job("t", connection_string=bad)


@pytest.mark.db
async def test_add_jobs_assigns_ids_in_the_order_of_the_specs(utils: WorkerUtils, db: str) -> None:
    # So that a batch added to a named queue runs in the order given.
    specs = [
        {
            "identifier": f"task{n % 3}",
            "payload": {"n": n},
            "queue_name": f"q{n % 7}" if n % 2 else None,
        }
        for n in range(300)
    ]
    await utils.add_jobs(specs)
    ns = [
        r["n"]
        for r in rows(
            db, "select (payload->>'n')::int as n from graphile_worker._private_jobs order by id"
        )
    ]
    assert ns == list(range(300))


# A large add_jobs goes out in chunks of 5,000 specs (one transaction); these
# batches span three chunks.
BIG = 12_000


@pytest.mark.db
async def test_a_large_add_jobs_adds_every_job_in_order(utils: WorkerUtils, db: str) -> None:
    payloads: list[Any] = [{"n": n} for n in range(BIG)]
    # Payloads of every JSON kind, with escapes, come back as they were given.
    payloads[1] = [1, "two", None, {"x": 3.5}]
    payloads[5_001] = 'a string with \t, " and \u00e9'
    payloads[10_002] = 42
    specs = [
        {"identifier": f"task{n % 3}", "payload": payload, "queue_name": "q" if n % 5 else None}
        for n, payload in enumerate(payloads)
    ]
    jobs = await utils.add_jobs(specs)
    assert len(jobs) == BIG
    by_id = sorted(jobs, key=lambda job: job.id)
    assert [job.payload for job in by_id] == payloads
    assert [job.task_identifier for job in by_id] == [f"task{n % 3}" for n in range(BIG)]
    assert [job.queue_name for job in by_id] == ["q" if n % 5 else None for n in range(BIG)]
    # Ids follow the order of the specs across chunks.
    stored = rows(db, "select payload from graphile_worker._private_jobs order by id")
    assert [r["payload"] for r in stored] == payloads


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"priority": 40_000}, r"specs\[11000\]\.priority: is 40000; it must be between"),
        ({"payload": {1, 2}}, r"specs\[11000\]\.payload: cannot be encoded as JSON"),
        ({"job_key": "k3"}, r"specs\[11000\]\.job_key: is also the job_key of specs\[3\]"),
    ],
)
@pytest.mark.db
async def test_a_bad_spec_late_in_a_large_add_jobs_adds_nothing(
    utils: WorkerUtils, db: str, bad: dict[str, Any], message: str
) -> None:
    specs: list[dict[str, Any]] = [
        {"identifier": "t", "payload": {"n": n}, "job_key": f"k{n}" if n < 10 else None}
        for n in range(BIG)
    ]
    specs[11_000] = {**specs[11_000], **bad}
    with pytest.raises(JobSpecError, match=message):
        await utils.add_jobs(specs)
    # The two chunks already inserted were rolled back.
    assert job_count(db) == 0


@pytest.mark.db
async def test_a_failed_large_add_jobs_leaves_the_callers_transaction_usable(
    utils: WorkerUtils, db: str
) -> None:
    specs: list[dict[str, Any]] = [{"identifier": "t", "payload": {"n": n}} for n in range(BIG)]
    specs[-1] = {"identifier": "t", "max_attempts": 0}
    async with utils.holding_connection() as conn, conn.transaction():
        await utils.add_job("before")
        with pytest.raises(JobSpecError, match=r"specs\[11999\]\.max_attempts"):
            await utils.add_jobs(specs)
        await utils.add_job("after")
    assert [
        r["task_identifier"]
        for r in rows(db, "select task_identifier from graphile_worker.jobs order by id")
    ] == ["before", "after"]


@pytest.mark.db
async def test_repeated_job_keys_are_refused_in_a_small_add_jobs_too(
    utils: WorkerUtils, db: str
) -> None:
    with pytest.raises(
        JobSpecError, match=r"specs\[2\]\.job_key: is also the job_key of specs\[0\]"
    ):
        await utils.add_jobs(
            [
                {"identifier": "t", "job_key": "same"},
                {"identifier": "t", "job_key": "other"},
                {"identifier": "t", "job_key": "same"},
            ]
        )
    assert job_count(db) == 0


# --- Pooled connections come back as they went out ------------------------------


@pytest.mark.parametrize("autocommit", [True, False])
@pytest.mark.db
async def test_maintenance_leaves_pooled_connections_as_they_were(
    db: str, autocommit: bool
) -> None:
    """gc_unique_locks and migrate need autocommit; on a pool's connection they
    restore the mode it had, so the next user of that connection (a task's
    ``with_pg_client``) commits the same way as before."""
    rows(db, "create table public.t (n int)")
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        db, min_size=1, max_size=1, kwargs={"autocommit": autocommit}, open=False
    )
    await pool.open(wait=True)
    try:
        async with make_worker_utils(pool=pool) as utils:
            await utils.gc_unique_locks()
            await utils.migrate()
            with pytest.raises(RuntimeError):
                async with utils.holding_connection() as conn:
                    assert conn.autocommit is autocommit
                    await conn.execute("insert into public.t values (1)")
                    raise RuntimeError("the block fails after its insert")
    finally:
        await pool.close()
    # Autocommit: the insert was committed as it ran; otherwise the block's
    # transaction was rolled back.
    assert value(db, "select count(*) from public.t") == (1 if autocommit else 0)


SWEEP_INSERT_TASK = """\
async def task(payload, helpers):
    async with helpers.with_pg_client() as conn:
        await conn.execute("insert into public.t values (%s)", (payload["n"],))
        raise RuntimeError("the task fails after its insert")
"""


@pytest.mark.db
async def test_a_tasks_statements_commit_the_same_way_after_a_sweep(
    utils: WorkerUtils, db: str, tmp_path: Path
) -> None:
    """The worker's pool is in autocommit: a statement a task runs is committed
    at once, before and after the periodic sweep (whose unique-lock cleanup
    needs autocommit) has used the task's connection."""
    rows(db, "create table public.t (n int)")
    (tmp_path / "insert.py").write_text(SWEEP_INSERT_TASK)
    # An expired unique-job lock: its deletion shows that a sweep has run.
    await utils.add_job("unknown_task", {}, unique={"period": 0.001})
    pool = WorkerPool(
        db,
        load_task_directory(tmp_path),
        WorkerOptions(
            concurrency=1, max_pool_size=2, stale_sweep_interval=(0.02, 0.05), log_success=False
        ),
    )
    running = asyncio.ensure_future(pool.run())
    try:
        await until(
            lambda: value(db, "select count(*) from graphile_worker._private_py_unique_locks") == 0,
            10,
            "a sweep",
        )
        await utils.add_jobs(
            [{"identifier": "insert", "payload": {"n": n}, "max_attempts": 1} for n in range(20)]
        )
        await until(
            lambda: (
                value(
                    db,
                    "select count(*) from graphile_worker.jobs where task_identifier = 'insert' "
                    "and (attempts = 0 or locked_at is not null)",  # not yet failed for good
                )
                == 0
            ),
            20,
            "the jobs to be done",
        )
    finally:
        pool.stop()
        await running
    assert value(db, "select count(*) from public.t") == 20


# --- A held connection stays with its block ---------------------------------------


@pytest.mark.db
async def test_a_task_spawned_in_holding_connection_does_not_use_it_after_the_block(
    db: str,
) -> None:
    """A task created inside ``holding_connection()`` inherits the held
    connection while the block runs; once the block has ended the connection is
    back in the pool (here: inside another user's transaction), and the spawned
    task must take a connection of its own."""
    async with make_worker_utils(connection_string=db, max_pool_size=2) as utils:
        go = asyncio.Event()

        async def later() -> None:
            await go.wait()
            await utils.add_job("t", {"from": "spawned task"})

        async with utils.holding_connection() as held:
            held_pid = held.info.backend_pid
            spawned = asyncio.ensure_future(later())
        # Another user takes both connections and opens a transaction on the one
        # the block held; the other goes back to the pool for the spawned task.
        first, second = await utils.pool.getconn(), await utils.pool.getconn()
        same, other = (first, second) if first.info.backend_pid == held_pid else (second, first)
        await same.execute("begin")
        await same.execute("select 1")
        await utils.pool.putconn(other)
        go.set()
        await asyncio.wait_for(spawned, 10)
        await same.execute("rollback")  # the other user's work is rolled back
        await utils.pool.putconn(same)
    # The spawned task's job was not in that transaction.
    assert job_count(db) == 1
