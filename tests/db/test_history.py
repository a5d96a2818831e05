"""Results and history: what a task returns is its result, read back from any
process with the state of the job (one state model), kept for a while and
pruned by the workers themselves."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from dbhelpers import list_history_for_expiry, rows, value
from psycopg import sql
from workers import until, worker

from worker_cli import (
    Helpers,
    JobResult,
    JobSpecError,
    ResultUnavailable,
    WorkerUtils,
    make_sync_worker_utils,
    make_worker_utils,
    run_once,
)
from worker_cli.sql import compose
from worker_cli.sql import history as history_sql
from worker_cli.worker.background.pruner import HistoryPruner

pytestmark = pytest.mark.db

HISTORY = "graphile_worker._private_py_job_history"
EXPIRY = "graphile_worker._private_py_job_history_expiry"


async def drain(db: str, tasks: dict[str, Any], **options: Any) -> None:
    async with asyncio.timeout(30):
        assert await run_once(db, task_list=tasks, no_handle_signals=True, **options) == 0


async def test_a_tasks_return_value_is_its_result(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("add", {"a": 1, "b": 2}, queue_name="sums")

    async def add(payload: dict[str, int], helpers: Helpers) -> dict[str, Any]:
        return {"sum": payload["a"] + payload["b"], "text": "é\x00", "list": [1.5, None]}

    await drain(db, {"add": add})
    assert await utils.get_job_status(job.id) == "succeeded"
    record = await utils.get_job_result(job.id)
    assert record.result == {"sum": 3, "text": "é\x00", "list": [1.5, None]}
    assert (record.id, record.task_identifier, record.queue_name) == (job.id, "add", "sums")
    assert (record.attempts, record.max_attempts, record.last_error) == (1, 25, None)
    assert record.created_at is not None and record.started_at is not None
    assert record.finished_at is not None and record.started_at <= record.finished_at
    assert record.finished
    # Kept a day (the default), from when it finished.
    kept = value(db, f"select expires_at - finished_at from {HISTORY} where job_id = %s", (job.id,))
    assert kept == timedelta(days=1)
    # The live row is gone, as with history off: Node sees a completed job.
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_plain_and_batch_tasks_results_and_none(utils: WorkerUtils, db: str) -> None:
    plain = await utils.add_job("plain", {"n": 4})
    batch = await utils.add_job("batch", [1, 2])
    nothing = await utils.add_job("nothing", {})

    def plain_task(payload: dict[str, int], helpers: Helpers) -> list[int]:
        return [payload["n"]] * 2

    async def batch_task(payload: list[int], helpers: Helpers) -> list[Any]:
        return [item * 10 for item in payload]

    async def nothing_task(payload: Any, helpers: Helpers) -> None:
        return None

    await drain(db, {"plain": plain_task, "batch": batch_task, "nothing": nothing_task})
    assert (await utils.get_job_result(plain.id)).result == [4, 4]
    assert (await utils.get_job_result(batch.id)).result == [10, 20]
    nothing_record = await utils.get_job_result(nothing.id)
    assert nothing_record.state == "succeeded" and nothing_record.result is None


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        ({"n": {1, 2}}, "not JSON: TypeError: Object of type set is not JSON serializable"),
        (math.nan, "not JSON: ValueError: Out of range float values are not JSON compliant"),
        ("x" * 200, "too large: 202 bytes, more than the limit of 100"),
    ],
)
async def test_a_result_that_cannot_be_kept_still_succeeds(
    utils: WorkerUtils, db: str, caplog: Any, returned: Any, reason: str
) -> None:
    job = await utils.add_job("odd", {})

    async def odd(payload: Any, helpers: Helpers) -> Any:
        return returned

    with caplog.at_level(logging.WARNING, logger="graphile_worker"):
        await drain(db, {"odd": odd}, max_result_bytes=100)
    record = await utils.get_job_result(job.id)
    # (Python 3.12's json names the value: "... not JSON compliant: nan".)
    assert record.state == "succeeded" and record.result_error.startswith(reason)
    with pytest.raises(ResultUnavailable, match="succeeded, but its result was not kept"):
        _ = record.result
    assert any(f"Job {job.id} (odd) succeeded, but its result is not kept" in r.getMessage()
               for r in caplog.records)  # fmt: skip


async def test_history_off_records_nothing(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {})

    async def t(payload: Any, helpers: Helpers) -> str:
        return "done"

    await drain(db, {"t": t}, history=False)
    assert value(db, f"select count(*) from {HISTORY}") == 0
    assert await utils.get_job_status(job.id) == "unknown"


async def test_the_states_of_live_jobs(utils: WorkerUtils, db: str) -> None:
    from datetime import UTC, datetime

    later = await utils.add_job("t", {}, run_at=datetime.now(UTC) + timedelta(hours=1))
    due = await utils.add_job("t", {})
    retry = await utils.add_job("fails", {}, max_attempts=3)
    dead = await utils.add_job("fails", {}, max_attempts=1)

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("no")

    await drain(db, {"fails": fails})
    assert await utils.get_job_status(later.id) == "scheduled"
    assert await utils.get_job_status(due.id) == "waiting"
    retrying = await utils.get_job_result(retry.id)
    assert (retrying.state, retrying.last_error, retrying.attempts) == (
        "retrying",
        "ValueError: no",
        1,
    )
    assert await utils.get_job_status(dead.id) == "failed"
    with pytest.raises(ResultUnavailable, match=f"job {dead.id} has no result: it is failed"):
        _ = (await utils.get_job_result(dead.id)).result

    started = asyncio.Event()
    release = asyncio.Event()

    async def t(payload: Any, helpers: Helpers) -> None:
        started.set()
        await release.wait()

    async with worker(db, {"t": t}) as runner:
        await started.wait()
        running = await utils.get_job_result(due.id)
        assert running.state == "running" and running.locked_by == runner.pool.id
        release.set()


async def test_a_job_with_no_row_anywhere_is_unknown(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("t", {})
    await utils.complete_jobs([job.id])  # removed by an admin function: no history
    assert await utils.get_job_status(job.id) == "unknown"
    assert await utils.get_job_status(10**12) == "unknown"
    record = await utils.get_job_result(10**12)
    assert record == JobResult(id=10**12, state="unknown")
    assert not record.result_error and record.finished


@pytest.mark.parametrize("job_id", [0, -1, 2**63, True, "7"])
async def test_a_bad_job_id_is_refused(utils: WorkerUtils, job_id: Any) -> None:
    with pytest.raises(JobSpecError, match="job_id: is"):
        await utils.get_job_result(job_id)


async def test_sql_and_the_sync_twin_see_the_same(db: str) -> None:
    with make_sync_worker_utils(connection_string=db) as sync:
        job = sync.add_job("t", {})

        async def t(payload: Any, helpers: Helpers) -> list[str]:
            return ["ok"]

        await drain(db, {"t": t})
        assert sync.get_job_status(job.id) == "succeeded"
        assert sync.get_job_result(job.id).result == ["ok"]
    [row] = rows(db, "select state, result::text from graphile_worker.py_job_status(%s)", (job.id,))
    assert row == {"state": "succeeded", "result": '["ok"]'}


async def test_a_job_due_at_minus_infinity_has_a_readable_state(
    utils: WorkerUtils, db: str
) -> None:
    job_id = value(db, "select id from graphile_worker.add_job('t', run_at => '-infinity')")
    record = await utils.get_job_result(job_id)
    assert record.state == "waiting" and record.run_at is not None
    assert record.run_at.year == 1


async def test_a_refused_result_is_dropped_and_the_success_recorded(
    utils: WorkerUtils, db: str
) -> None:
    rows(
        db,
        f"""
        create function public.refuse_result() returns trigger language plpgsql as $$
        begin
          if new.result::text like '%refuse-me%' then
            raise exception 'this result is refused';
          end if;
          return new;
        end $$;
        create trigger refuse_result before insert on {HISTORY}
        for each row execute function public.refuse_result();
        """,
    )
    refused = await utils.add_job("t", {"r": "refuse-me"})
    fine = [await utils.add_job("t", {"r": n}) for n in range(3)]

    async def t(payload: dict[str, Any], helpers: Helpers) -> Any:
        return payload["r"]

    await drain(db, {"t": t})
    record = await utils.get_job_result(refused.id)
    assert record.state == "succeeded"
    assert record.result_error is not None and "this result is refused" in record.result_error
    assert [(await utils.get_job_result(job.id)).result for job in fine] == [0, 1, 2]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


# --- pruning -------------------------------------------------------------------------------


def fill_history(db: str, expired: int, kept: int) -> None:
    """History rows: ``expired`` ones past their time, ``kept`` ones not."""
    rows(
        db,
        f"""
        insert into {HISTORY} (job_id, state, task_identifier, priority, attempts,
          max_attempts, revision, created_at, run_at, finished_at, expires_at)
        select n, 'succeeded', 't', 0, 1, 25, 0, now(), now(), now(),
          case when n <= %(expired)s then now() - interval '1 minute'
            else now() + interval '1 day' end
        from generate_series(1, %(total)s) as n
        """,
        {"expired": expired, "total": expired + kept},
    )
    list_history_for_expiry(db)
    rows(db, f"analyze {HISTORY}")
    rows(db, f"analyze {EXPIRY}")


async def test_the_pruner_deletes_expired_rows_in_batches(utils: WorkerUtils, db: str) -> None:
    fill_history(db, expired=2500, kept=100)
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    # At most 2 batches of 1000 a turn: the rest waits for the next turn.
    assert await pruner.prune(batch=1000, max_batches=2) == 2000
    assert await pruner.prune(batch=1000, max_batches=2) == 500
    assert await pruner.prune(batch=1000, max_batches=2) == 0
    assert value(db, f"select count(*) from {HISTORY}") == 100
    assert value(db, f"select count(*) from {HISTORY} where expires_at < now()") == 0


async def test_one_pool_prunes_at_a_time(utils: WorkerUtils, db: str) -> None:
    fill_history(db, expired=10, kept=0)
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    with psycopg.connect(db) as other:  # another pool pruning right now
        other.execute(
            "select pg_advisory_xact_lock(%s, hashtext('graphile_worker'))", (0x67775068,)
        )
        assert await pruner.prune() is None
    assert await pruner.prune() == 10


async def test_a_worker_prunes_by_itself(db: str) -> None:
    fill_history(db, expired=30, kept=5)
    from worker_cli.config.options import WorkerOptions
    from worker_cli.tasks.loader import make_task_list
    from worker_cli.worker import WorkerPool

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    options = WorkerOptions(history_prune_interval=(0.05, 0.1))
    pool = WorkerPool(db, make_task_list({"t": t}), options)
    running = asyncio.create_task(pool.run())
    try:
        await until(
            lambda: value(db, f"select count(*) from {HISTORY}") == 5,
            what="the expired rows pruned",
        )
    finally:
        pool.stop()
        await running


@pytest.mark.slow
async def test_pruning_a_million_rows_reads_only_what_it_deletes(
    utils: WorkerUtils, db: str
) -> None:
    fill_history(db, expired=20_000, kept=1_000_000)
    statement = compose(history_sql.PRUNE_HISTORY, "graphile_worker")
    params = {"lock_namespace": 1, "schema": "graphile_worker", "limit": 10_000, "scan": 10_000}
    with psycopg.connect(db) as conn:
        plan = "\n".join(
            row[0] for row in conn.execute(sql.SQL("explain ") + statement, params).fetchall()
        )
    # The ledger through its expires_at index, the history by primary key:
    # no table read whole.
    assert "_private_py_job_history_expiry_expires_at" in plan, plan
    assert "_private_py_job_history_pkey" in plan and "Seq Scan" not in plan, plan
    pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
    assert await pruner.prune() == 20_000
    assert value(db, f"select count(*) from {HISTORY}") == 1_000_000
    assert value(db, f"select sum(cardinality(job_ids)) from {EXPIRY}") == 1_000_000


async def test_the_cleanup_archives_permanently_failed_jobs(utils: WorkerUtils, db: str) -> None:
    job = await utils.add_job("fails", {"n": 1}, max_attempts=1)

    async def fails(payload: Any, helpers: Helpers) -> None:
        raise ValueError("for good")

    await drain(db, {"fails": fails})
    await utils.cleanup(["DELETE_PERMAFAILED_JOBS"])
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    record = await utils.get_job_result(job.id)
    assert (record.state, record.last_error, record.attempts) == (
        "failed",
        "ValueError: for good",
        1,
    )
    kept = value(db, f"select expires_at - now() from {HISTORY} where job_id = %s", (job.id,))
    assert timedelta(days=6, hours=23) < kept <= timedelta(days=7)


def test_the_readmes_results_example_runs_as_written(db: str, tmp_path: Any) -> None:
    import subprocess
    import sys

    from dbhelpers import cli_path
    from readme_blocks import app_env, blocks, write_files

    heading = "### Results and history"
    files = write_files(heading, tmp_path)
    assert set(files) == {"tasks/resize.py", "show_result.py"}
    job_id = value(db, "select id from graphile_worker.add_job('resize', '{\"width\": 640}')")
    env = app_env(db)
    worker_run = subprocess.run(
        [cli_path(), "--once"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert worker_run.returncode == 0, worker_run.stderr
    shown = subprocess.run(
        [sys.executable, "show_result.py", str(job_id)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    [transcript] = blocks(heading, "text")
    expected = transcript.splitlines()[1]
    assert shown.stdout.strip() == expected, shown.stderr


async def test_upgrading_lists_the_history_already_recorded_for_the_pruning(
    empty_db: str, tmp_path: Any
) -> None:
    """A schema at Python migration 10 with history rows: migration 11 lists them
    in the expiry ledger (1,000 ids a row), so the pruning finds them."""
    from migrations_before import install_before

    from worker_cli.schema.migrate import migrate

    await install_before(empty_db, tmp_path, 10)
    rows(
        empty_db,
        f"""
        insert into {HISTORY} (job_id, state, task_identifier, priority, attempts,
          max_attempts, revision, created_at, run_at, finished_at, expires_at)
        select n, 'succeeded', 't', 0, 1, 25, 0, now(), now(), now(),
          case when n <= 2500 then now() - interval '1 minute' else now() + interval '1 day' end
        from generate_series(1, 2600) as n
        """,
    )
    async with await psycopg.AsyncConnection.connect(empty_db, autocommit=True) as conn:
        report = await migrate(conn, "graphile_worker")
    assert 11 in report.applied_py
    ledger = rows(empty_db, f"select expires_at < now() as expired, job_ids from {EXPIRY}")
    assert sorted(len(r["job_ids"]) for r in ledger if r["expired"]) == [500, 1000, 1000]
    assert sorted(len(r["job_ids"]) for r in ledger if not r["expired"]) == [100]
    async with make_worker_utils(connection_string=empty_db) as utils:
        pruner = HistoryPruner(utils, schema="graphile_worker", interval=(60, 120))
        assert await pruner.prune() == 2500
    assert value(empty_db, f"select count(*) from {HISTORY}") == 100
