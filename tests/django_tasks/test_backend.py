"""The backend in the application's process: enqueue, get_result, validation,
transactions, checks (no worker runs here)."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import pickle
import subprocess
import sys
import uuid

import pytest
from conftest import PROJECT, log_lines, manage
from dbhelpers import rows, value

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
RESULTS = "graphile_worker._private_py_django_results"


def counts(url: str) -> tuple[int, int]:
    return value(url, f"select count(*) from {JOBS}"), value(url, f"select count(*) from {RESULTS}")


def test_flags_and_backend(site: str) -> None:
    from django.tasks import task_backends

    from worker_cli.contrib.django import GraphileWorkerBackend

    backend = task_backends["default"]
    assert isinstance(backend, GraphileWorkerBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_enqueue_gives_a_ready_result_equal_to_get_result(site: str) -> None:
    from django.db import connection
    from django.tasks import TaskResultStatus
    from django.test.utils import CaptureQueriesContext
    from jobsapp.tasks import add

    with CaptureQueriesContext(connection) as queries:
        result = add.using(priority=7).enqueue(2, b=3)
    assert len(queries) == 1  # the job and its result row in one statement
    assert result.status == TaskResultStatus.READY
    assert len(result.id) < 64 and uuid.UUID(result.id)
    assert result.args == [2] and result.kwargs == {"b": 3}
    assert result.attempts == 0 and result.errors == [] and result.worker_ids == []
    assert result.enqueued_at is not None and result.started_at is None
    assert add.get_result(result.id) == result
    assert asyncio.run(add.aget_result(result.id)) == result
    assert pickle.loads(pickle.dumps(result)) == result
    # The job: django:<queue>, no graphile queue (Django queues are not serial),
    # graphile's priority is Django's negated, the backend's max_attempts (1).
    [job] = rows(
        site,
        f"select t.identifier, j.job_queue_id, j.priority, j.max_attempts, j.payload "
        f"from {JOBS} j join graphile_worker._private_tasks t on t.id = j.task_id",
    )
    assert job["identifier"] == "django:default" and job["job_queue_id"] is None
    assert job["priority"] == -7 and job["max_attempts"] == 1
    assert job["payload"] == {"result_id": result.id, "task": "jobsapp.tasks.add"}
    assert log_lines() == [f"signal enqueued {result.id} GraphileWorkerBackend READY"]


def test_run_after_and_task_max_attempts(site: str) -> None:
    from jobsapp.tasks import flaky

    when = dt.datetime.now(dt.timezone(dt.timedelta(hours=2))) + dt.timedelta(hours=1)
    result = flaky.using(run_after=when).enqueue(succeed_on=1)
    assert flaky.get_result(result.id) == result
    job = rows(site, f"select run_at, max_attempts from {JOBS}")[0]
    assert job["run_at"] == when and job["max_attempts"] == 2  # @task(max_attempts=2)


def test_bad_arguments_raise_type_error_and_write_nothing(site: str) -> None:
    from jobsapp.tasks import record

    for bad in (dt.datetime.now(), {1, 2}, object(), math.nan, math.inf):
        with pytest.raises(TypeError):
            record.enqueue(bad)
    assert counts(site) == (0, 0)


def test_unknown_and_malformed_ids_do_not_exist_and_keep_the_transaction(site: str) -> None:
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist
    from jobsapp.tasks import add

    with transaction.atomic():
        for bad in ("123", "", "not-a-uuid", str(uuid.uuid4()), "x" * 100):
            with pytest.raises(TaskResultDoesNotExist):
                add.get_result(bad)
        result = add.enqueue(1, 1)  # the transaction still works
    assert add.get_result(result.id).id == result.id


def test_rollback_enqueues_nothing_and_uncommitted_is_invisible(site: str) -> None:
    from django.db import transaction
    from django.tasks.exceptions import TaskResultDoesNotExist
    from jobsapp.tasks import add

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        result = add.enqueue(1, 2)
        assert add.get_result(result.id) == result  # seen in its own transaction
        assert counts(site) == (0, 0)  # but not by another connection
        raise Boom
    assert counts(site) == (0, 0)
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(result.id)
    with transaction.atomic():
        add.enqueue(1, 2)
        assert counts(site) == (0, 0)
    assert counts(site) == (1, 1)


def test_validation_is_djangos(site: str) -> None:
    from django.tasks.exceptions import InvalidTask
    from jobsapp.tasks import add

    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
        add.using(queue_name="nope")
    with pytest.raises(InvalidTask):
        add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        add.using(run_after=dt.datetime(2030, 1, 1))  # naive with USE_TZ
    assert counts(site) == (0, 0)


def test_aenqueue_from_async_code(site: str) -> None:
    from jobsapp.tasks import add

    async def view() -> str:
        result = await add.aenqueue(4, 5)
        fetched = await add.aget_result(result.id)
        assert fetched == result
        return result.id

    result_id = asyncio.run(view())
    assert value(site, f"select count(*) from {RESULTS} where id = %s", [result_id]) == 1


def test_a_job_of_another_task_is_a_mismatch(site: str) -> None:
    from django.tasks.exceptions import TaskResultMismatch
    from jobsapp.tasks import add, record

    result = add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        record.get_result(result.id)


def test_checks(site: str) -> None:
    from django.conf import settings
    from django.core import checks
    from django.tasks import task_backends
    from django.test import override_settings

    def ids(databases: list[str] | None = None) -> list[str]:
        return [m.id for m in checks.run_checks(databases=databases) if m.id.startswith("graphile")]

    assert ids(["default"]) == []
    # The alias "bare" points at a database without the schema.
    assert task_backends["bare"].check(databases=["bare"])[0].id == "graphile_worker.W002"
    assert "is not installed" in task_backends["bare"].check(databases=["bare"])[0].msg
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": "worker_cli.contrib.django.GraphileWorkerBackend",
                "QUEUES": ["default", "q" * 130],
            }
        },
        # Every app but ours (Django's own apps' checks need them installed).
        INSTALLED_APPS=[
            app for app in settings.INSTALLED_APPS if app != "worker_cli.contrib.django"
        ],
    ):
        assert ids() == ["graphile_worker.E001", "graphile_worker.E003"]


def test_manage_py_check_and_migrate_warn_while_the_schema_is_missing(site: str) -> None:
    # Django 6.1 calls backend.check() without the databases: the app's own
    # check looks. The alias "bare" is a database without the schema.
    done = manage("check")
    assert done.returncode == 0, done.stderr
    warning = (
        "(graphile_worker.W002) graphile-worker's schema 'graphile_worker' is not installed "
        "(or not migrated) in database 'bare'"
    )
    assert warning in done.stderr
    assert "Run `python manage.py graphile_worker --schema-only`" in done.stderr
    assert "database 'default'" not in done.stderr  # it has the schema
    done = manage("migrate", "--database", "bare", "-v", "0")
    assert done.returncode == 0 and warning in done.stderr, done.stderr
    done = manage("migrate", "-v", "0")
    assert done.returncode == 0 and "W002" not in done.stderr, done.stderr
    # runserver (on a port of the system's choosing) checks before it serves.
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", "127.0.0.1:0"],
        cwd=PROJECT,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        seen = []
        for line in server.stdout:
            seen.append(line)
            if line.startswith("System check identified") and "(0 silenced)" in line:
                break  # the last line of the checks' report
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert warning in "".join(seen)


def test_a_task_outside_the_installed_apps_is_refused_at_enqueue(site: str) -> None:
    from django.tasks.exceptions import InvalidTask
    from outside_tasks import stray

    with pytest.raises(InvalidTask) as refused:
        stray.enqueue(1)
    assert str(refused.value) == (
        "Task 'outside_tasks.stray' is in the module 'outside_tasks', which is not in an "
        "installed app, and the worker runs only the tasks of INSTALLED_APPS: move it to a "
        "module of an installed app (such as myapp/tasks.py) or add its app to INSTALLED_APPS."
    )
    assert counts(site) == (0, 0)


def test_bad_options_are_one_clear_error(site: str) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from worker_cli.contrib.django import GraphileWorkerBackend

    with pytest.raises(ImproperlyConfigured, match="unknown key 'databse'"):
        GraphileWorkerBackend("x", {"OPTIONS": {"databse": "default"}})
    with pytest.raises(ImproperlyConfigured, match="max_attempts"):
        GraphileWorkerBackend("x", {"OPTIONS": {"max_attempts": 0}})


def test_a_missing_schema_says_what_to_run(site: str) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from jobsapp.tasks import add

    with pytest.raises(ImproperlyConfigured, match="graphile_worker --schema-only"):
        add.using(backend="bare").enqueue(1, 2)
    connections["bare"].close()


def test_the_worker_connects_with_djangos_settings(site: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from worker_cli.contrib.django.connection import conninfo_of

    params = conninfo_to_dict(conninfo_of("default"))
    expected = conninfo_to_dict(site)
    assert params["dbname"] == expected["dbname"] and params["host"] == expected["host"]
    assert "cursor_factory" not in params and "context" not in params


NAIVE_TIMES = """
import datetime as dt
from jobsapp.tasks import add
when = dt.datetime(2031, 6, 1, 12, 30)  # naive: Europe/Paris (TIME_ZONE), USE_TZ = False
result = add.using(run_after=when).enqueue(1, 2)
again = add.get_result(result.id)
assert again == result, (again, result)
assert again.task.run_after == when and again.enqueued_at.tzinfo is None
print(result.id)
"""

#: After the worker ran started_tzinfo: the times it gave the task were naive too.
NAIVE_IN_THE_WORKER = """
from jobsapp.tasks import started_tzinfo
result = started_tzinfo.get_result(RESULT_ID)
assert result.return_value == "None", result.return_value
assert result.finished_at.tzinfo is None
"""


def test_naive_times_without_use_tz(site: str) -> None:
    import os

    from conftest import manage
    from jobsapp.tasks import started_tzinfo

    os.environ["DJANGO_USE_TZ"] = "0"
    try:
        done = manage("shell", "-c", NAIVE_TIMES)
        assert done.returncode == 0, done.stderr
        result_id = done.stdout.strip().splitlines()[-1]
        started = started_tzinfo.enqueue()
        assert manage("graphile_worker", "--once").returncode == 0
        check = NAIVE_IN_THE_WORKER.replace("RESULT_ID", repr(started.id))
        done = manage("shell", "-c", check)
        assert done.returncode == 0, done.stderr
    finally:
        del os.environ["DJANGO_USE_TZ"]
    run_at = value(
        site,
        f"select j.run_at from {JOBS} j join {RESULTS} r on r.job_id = j.id where r.id = %s",
        [result_id],
    )
    assert run_at == dt.datetime(2031, 6, 1, 10, 30, tzinfo=dt.UTC)  # 12:30 in Paris (CEST)
