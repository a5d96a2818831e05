"""The worker, ``python manage.py graphile_worker``, as real subprocesses."""

from __future__ import annotations

import datetime as dt
import json
import signal
import uuid
from pathlib import Path

import pytest
from conftest import log_lines, manage, start_worker, stop, wait_for
from dbhelpers import rows, value
from pg_server import PgServer
from worker_fleet import wait_until_listening

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
RESULTS = "graphile_worker._private_py_django_results"
#: A worker's heartbeat settings short enough for a test to see a dead one released.
FAST_HEARTBEAT = ("--heartbeat-interval", "0.2", "--heartbeat-timeout", "1.5")


def run_once(*args: str) -> str:
    done = manage("graphile_worker", "--once", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def result(result_id: str):  # type: ignore[no-untyped-def]
    from django.tasks import task_backends

    return task_backends["default"].get_result(result_id)


def test_success_and_failure_as_django_defines_them(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import add, bad_return, fail

    ok, bad, odd = add.enqueue(2, 3), fail.enqueue("boom"), bad_return.enqueue()
    run_once()
    ok.refresh()  # the READY result enqueue() gave, refreshed in place
    assert ok.status == TaskResultStatus.SUCCESSFUL and ok.return_value == 5
    done = add.get_result(ok.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.attempts == 1 and len(done.worker_ids) == 1 and done.errors == []
    assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
    failed = fail.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 1
    [error] = failed.errors
    assert error.exception_class is ValueError
    assert error.traceback.endswith("ValueError: boom\n")
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    assert failed.finished_at >= failed.started_at
    # An unserialisable return value fails the task (as Django's own backends).
    assert bad_return.get_result(odd.id).errors[0].exception_class is TypeError
    # Successes leave no job; final failures keep theirs, permanently failed.
    assert (
        rows(site, f"select attempts, max_attempts from {JOBS}")
        == [{"attempts": 1, "max_attempts": 1}] * 2
    )
    assert log_lines().count("add 2 3") == 1


def test_signals_sent_by_the_backend_and_the_worker(site: str) -> None:
    from jobsapp.tasks import add, fail

    ok, bad = add.enqueue(1, 1), fail.enqueue("no")
    out = run_once()
    signals = [line for line in log_lines() if line.startswith("signal")]
    for result_id, outcome in ((ok.id, "SUCCESSFUL"), (bad.id, "FAILED")):
        assert [line for line in signals if result_id in line] == [
            f"signal enqueued {result_id} GraphileWorkerBackend READY",
            f"signal started {result_id} GraphileWorkerBackend RUNNING",
            f"signal finished {result_id} GraphileWorkerBackend {outcome}",
        ]
    # Django's own receivers log in the worker; the failure with its traceback.
    assert f"Task id={ok.id} path=jobsapp.tasks.add state=SUCCESSFUL" in out
    assert f"Task id={bad.id} path=jobsapp.tasks.fail state=FAILED" in out


def test_each_log_line_prints_once_with_debug_on(
    site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DEBUG = True gives Django's "django" logger a console handler of its
    # own; the project's LOGGING gives "django.tasks" one too.
    from jobsapp.tasks import add

    monkeypatch.setenv("DJANGO_DEBUG", "1")
    ok = add.enqueue(2, 2)
    out = run_once()
    for state in ("RUNNING", "SUCCESSFUL"):
        assert out.count(f"Task id={ok.id} path=jobsapp.tasks.add state={state}") == 1, out


def test_priority_order_and_fifo(site: str) -> None:
    from django.db import transaction
    from jobsapp.tasks import record

    with transaction.atomic():
        for name, priority in (("low", -10), ("first", 0), ("high", 50), ("second", 0)):
            record.using(priority=priority).enqueue(name)
    run_once("-j", "1")
    assert [line.split()[1] for line in log_lines() if line.startswith("start")] == [
        "high",
        "first",
        "second",
        "low",
    ]


def test_run_after_is_respected(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import record

    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    delayed = record.using(run_after=later).enqueue("later")
    record.enqueue("now")
    worker = start_worker("--poll-interval", "100")
    try:
        wait_for(lambda: "end now" in log_lines(), what="the job without run_after")
        assert result(delayed.id).status == TaskResultStatus.READY
        wait_for(lambda: result(delayed.id).is_finished, what="the delayed job")
    finally:
        stop(worker)
    assert result(delayed.id).started_at >= later


def test_queue_routing_and_parallel_default_queue(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import record, send_email

    email = send_email.enqueue("a@example.com")
    first, second = record.enqueue("one", sleep=1), record.enqueue("two", sleep=1)
    run_once("-j", "2")  # --queue-name default
    lines = log_lines()
    assert "email a@example.com" not in lines
    assert result(email.id).status == TaskResultStatus.READY
    # Both "default" jobs ran at once: a Django queue is not a serial queue.
    starts_and_ends = [line.split()[0] for line in lines if line.split()[0] in ("start", "end")]
    assert starts_and_ends == ["start", "start", "end", "end"]
    assert result(first.id).is_finished and result(second.id).is_finished
    run_once("--queue-name", "emails")
    assert "email a@example.com" in log_lines()
    assert result(email.id).status == TaskResultStatus.SUCCESSFUL


def test_queue_name_star_and_unknown_names(site: str) -> None:
    from jobsapp.tasks import record, send_email

    done = manage("graphile_worker", "--once", "--queue-name", "default,nope")
    assert done.returncode == 2
    assert "'nope' not in TASKS['default']['QUEUES']" in done.stderr
    assert "Traceback" not in done.stderr
    email, job = send_email.enqueue("b@example.com"), record.enqueue("r")
    run_once("--queue-name", "*")  # every name in QUEUES
    assert result(email.id).is_finished and result(job.id).is_finished


def test_retries_with_max_attempts(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import flaky

    recovers, keeps_failing = flaky.enqueue(succeed_on=2), flaky.enqueue(succeed_on=5)
    worker = start_worker("--poll-interval", "100")
    try:
        # Between attempts: READY, with the first attempt's error.
        wait_for(lambda: len(result(recovers.id).errors) == 1, what="a first failure")
        between = result(recovers.id)
        assert between.status in (TaskResultStatus.READY, TaskResultStatus.RUNNING)
        wait_for(lambda: result(recovers.id).is_finished, timeout=20, what="the retry")
        wait_for(lambda: result(keeps_failing.id).is_finished, timeout=20, what="the retry")
    finally:
        stop(worker)
    done = result(recovers.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 2
    assert done.attempts == 2 and len(done.errors) == 1
    failed = result(keeps_failing.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 2
    assert [e.traceback.splitlines()[-1] for e in failed.errors] == [
        "RuntimeError: attempt 1 fails",
        "RuntimeError: attempt 2 fails",
    ]
    assert failed.started_at < failed.last_attempted_at


def test_a_finished_task_whose_job_runs_again_is_not_run_again(site: str) -> None:
    """The worker wrote the outcome, then stopped before the job's completion:
    the job runs again (at least once), the task does not."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import add

    enqueued = add.enqueue(3, 4)
    run_once()
    value(
        site,
        "select 1 from graphile_worker.add_job('django:default', %s::json)",
        [json.dumps({"result_id": enqueued.id, "task": "jobsapp.tasks.add"})],
    )
    out = run_once()
    assert log_lines().count("add 3 4") == 1 and "not run again" in out
    assert value(site, f"select count(*) from {JOBS}") == 0  # the job completed
    assert result(enqueued.id).status == TaskResultStatus.SUCCESSFUL


def test_an_unreadable_result_row_fails_its_job_alone_and_for_good(site: str) -> None:
    """Result rows PostgreSQL keeps but Python cannot read back (JSON nested
    12,000 deep, a 5,000-digit integer): their jobs fail for good, once; the
    task enqueued beside them runs."""
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import add

    deep = _forge_json(site, "[" * 12000 + "]" * 12000)  # past 3.13's 9,999 levels
    huge = _forge_json(site, "[" + "9" * 5000 + "]")
    fine = add.enqueue(5, 6)
    run_once()
    assert result(fine.id).status == TaskResultStatus.SUCCESSFUL
    assert log_lines().count("add 5 6") == 1
    forged = rows(
        site,
        f"select r.id::text, r.status, r.errors, r.worker_ids, j.attempts, j.max_attempts "
        f"from {RESULTS} r join {JOBS} j on j.id = r.job_id",
    )
    assert {row["id"] for row in forged} == {deep, huge}
    for row in forged:  # failed for good (of add_job's 25 attempts), after one run
        assert row["attempts"] == row["max_attempts"] == 25 and len(row["worker_ids"]) == 1
        assert row["status"] == "FAILED" and len(row["errors"]) == 1


def _forge_json(site: str, args_json: str) -> str:
    """A job and result row whose args are ``args_json`` as written (add_job's 25 attempts)."""
    forged = str(uuid.uuid4())
    value(
        site,
        f"insert into {RESULTS} (id, job_id, backend, queue_name, task_path, priority, "
        "args, kwargs) select %s, j.id, 'default', 'default', 'jobsapp.tasks.add', 0, %s, '{}' "
        "from graphile_worker.add_job('django:default', %s::json) j returning 1",
        [forged, args_json, json.dumps({"result_id": forged})],
    )
    return forged


def test_a_task_that_discards_is_failed_at_once(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import gives_up

    enqueued = gives_up.enqueue("not worth retrying")
    run_once()
    done = result(enqueued.id)
    assert done.status == TaskResultStatus.FAILED and done.attempts == 1  # of 3
    assert done.errors[0].exception_class_path == "worker_cli.tasks.retry_policy.Discard"
    assert [line.split()[1:3] for line in log_lines() if "signal finished" in line] == [
        ["finished", enqueued.id]
    ]


@pytest.mark.parametrize("task_name", ["hang", "hang_first"])
def test_a_sigkilled_worker_never_leaves_a_task_running(site: str, task_name: str) -> None:
    """max_attempts=1 (hang): FAILED with JobLost once another worker sees the
    dead one; max_attempts=2 (hang_first): it runs again and succeeds, the
    lost attempt recorded as its first error."""
    from django.tasks import TaskResultStatus
    from jobsapp import tasks

    task = getattr(tasks, task_name)
    enqueued = task.enqueue("k")
    doomed = start_worker(*FAST_HEARTBEAT)
    wait_for(lambda: any(line.startswith(task_name) for line in log_lines()), what="the start")
    assert result(enqueued.id).status == TaskResultStatus.RUNNING
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate(timeout=10)
    survivor = start_worker(*FAST_HEARTBEAT, "--poll-interval", "100")
    try:
        wait_for(
            lambda: result(enqueued.id).status != TaskResultStatus.RUNNING,
            timeout=30,
            what="the dead worker's job released",
        )
        if task_name == "hang_first":
            wait_for(lambda: result(enqueued.id).is_finished, what="the second attempt")
    finally:
        stop(survivor)
    done = result(enqueued.id)
    assert done.errors[0].exception_class_path == "worker_cli.errors.JobLost"
    assert "killed or lost" in done.errors[0].traceback
    if task_name == "hang":
        assert done.status == TaskResultStatus.FAILED and done.finished_at is not None
        assert done.attempts == 1
    else:
        assert done.status == TaskResultStatus.SUCCESSFUL
        assert done.return_value == "attempt 2" and done.attempts == 2
        assert len(done.errors) == 1


def test_async_tasks_run_on_the_event_loop_and_context_has_the_attempt(site: str) -> None:
    from jobsapp.tasks import async_add, with_context

    coroutine, context = async_add.enqueue(20, 22), with_context.enqueue()
    run_once()
    assert async_add.get_result(coroutine.id).return_value == 42
    assert "async_add 20 22 True" in log_lines()  # on the worker's main (loop) thread
    assert with_context.get_result(context.id).return_value == {"id": context.id, "attempt": 1}


def test_three_workers_share_ten_tasks(site: str) -> None:
    from django.tasks import TaskResultStatus
    from jobsapp.tasks import record

    workers = [start_worker("-j", "2") for _ in range(3)]
    try:
        # Enqueued once all three listen: each then fetches its idle slots at
        # once (a worker up seconds before the others could run all ten).
        wait_until_listening(site, 3)
        enqueued = [record.enqueue(f"t{i}", sleep=0.3) for i in range(10)]
        wait_for(
            lambda: all(result(r.id).is_finished for r in enqueued), timeout=60, what="all ten"
        )
    finally:
        outputs = [stop(worker) for worker in workers]
    starts = [line.split()[1] for line in log_lines() if line.startswith("start")]
    assert sorted(starts) == sorted(f"t{i}" for i in range(10))  # each exactly once
    assert {result(r.id).status for r in enqueued} == {TaskResultStatus.SUCCESSFUL}
    assert len({result(r.id).worker_ids[0] for r in enqueued}) >= 2
    assert len({int(line.split()[2]) for line in log_lines() if line.startswith("start")}) >= 2
    assert all("Traceback" not in out for out in outputs)


def _forge(site: str, task_path: str, args: list[object]) -> str:
    """A job and result row written by hand (as anyone able to insert could)."""
    forged = str(uuid.uuid4())
    value(
        site,
        f"insert into {RESULTS} (id, job_id, backend, queue_name, task_path, priority, "
        "args, kwargs) select %s, j.id, 'default', 'default', %s, 0, %s, '{}' "
        "from graphile_worker.add_job('django:default', %s::json) j returning 1",
        [forged, task_path, json.dumps(args), json.dumps({"result_id": forged})],
    )
    return forged


def test_a_job_naming_anything_but_a_task_runs_nothing(site: str, tmp_path: Path) -> None:
    target = tmp_path / "called"
    plain = _forge(site, "jobsapp.tasks.not_a_task", [str(target)])
    shell = _forge(site, "os.system", [f"touch {target}"])
    # A module outside the installed apps is not even imported ("this" prints on import).
    outside = _forge(site, "this.s", [])
    value(
        site,
        "select 1 from graphile_worker.add_job('django:default', "
        """'{"result_id": "not a uuid", "task": "os.system"}')""",
    )
    out = run_once()
    assert not target.exists()
    assert "Beautiful is better than ugly" not in out
    stored = {
        row["id"]: row for row in rows(site, f"select id::text, status, errors from {RESULTS}")
    }
    for forged in (plain, shell, outside):
        assert stored[forged]["status"] == "FAILED"
        assert "is not a Django Task" in stored[forged]["errors"][0]["traceback"]
    assert "not in an installed app" in stored[outside]["errors"][0]["traceback"]
    assert "not a Django task job" in out
    # All failed for good (Discard), whatever attempts they had left (add_job's 25).
    assert value(site, f"select count(*) from {JOBS} where attempts = max_attempts") == 4


def test_schema_only_and_clear_errors(site: str) -> None:
    done = manage("graphile_worker", "--schema-only")
    assert done.returncode == 0 and "is up to date" in done.stdout
    done = manage("graphile_worker", "--backend", "nope")
    assert done.returncode == 2 and "The connection 'nope' doesn't exist" in done.stderr
    done = manage("graphile_worker", "--schema", "other")
    assert done.returncode == 2 and "leave it out" in done.stderr


def test_an_unusable_configuration_is_one_line(
    site: str, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: str) -> str:
        done = manage("graphile_worker", *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        return done.stderr

    with monkeypatch.context() as patch:
        patch.setenv("DJANGO_SQLITE", "1")
        assert refused("--once") == (
            "Error (graphile_worker.E002): TASKS['default'] uses database 'default', whose "
            "ENGINE is 'django.db.backends.sqlite3': graphile-worker needs PostgreSQL "
            "(django.db.backends.postgresql). Set DATABASES['default'] to a PostgreSQL "
            "database (ENGINE 'django.db.backends.postgresql'), or OPTIONS['database'] to "
            "the alias of one.\n"
        )
    with monkeypatch.context() as patch:
        patch.setenv("DJANGO_DATABASE_URL", pg.url("no_such_database_i43"))
        assert "could not connect to the database" in refused("--once")
    # A database without the schema: the worker installs it, no warning first.
    with monkeypatch.context() as patch:
        patch.setenv("DJANGO_DATABASE_URL", pg.url(pg.create_database()))
        done = manage("graphile_worker", "--once")
        assert done.returncode == 0 and "W002" not in done.stderr, done.stderr


def test_finished_results_are_pruned_after_keep_results_days(site: str) -> None:
    from jobsapp.tasks import add, fail, record

    from worker_cli.contrib.django.pruning import PRUNE_TASK, prune_cron_items

    old_ok, old_failed, recent = add.enqueue(1, 1), fail.enqueue("x"), add.enqueue(2, 2)
    run_once()
    waiting = record.using(queue_name="emails").enqueue("still waiting")
    value(
        site,
        f"update {RESULTS} set finished_at = now() - interval '15 days', "
        "enqueued_at = now() - interval '15 days' where id = any(%s::uuid[]) returning 1",
        [[old_ok.id, old_failed.id]],
    )
    value(site, f"update {RESULTS} set enqueued_at = now() - interval '30 days' where id = %s "
          "returning 1", [waiting.id])  # fmt: skip
    # What the hourly cron item (14 days by default) adds, run now.
    [item] = prune_cron_items(14)
    assert (item.task, item.minutes, dict(item.payload)) == (
        PRUNE_TASK,
        frozenset({17}),
        {"seconds": 14 * 86400},
    )
    assert prune_cron_items(None) == []
    value(
        site,
        "select 1 from graphile_worker.add_job(%s, %s::json)",
        [PRUNE_TASK, json.dumps(dict(item.payload))],
    )
    run_once()
    kept = {row["id"] for row in rows(site, f"select id::text from {RESULTS}")}
    assert kept == {recent.id, waiting.id}  # unfinished results are never pruned
