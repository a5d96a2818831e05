"""Side by side: Django tasks through GraphileWorkerBackend and through
django-tasks-db's DatabaseBackend, enqueued the same way (each in its own
transaction), drained by each one's worker (``graphile_worker --once -j 1``
and ``-j 10``; ``db_worker --batch``). Rounds alternate; prints each round
and the ratios to django-tasks-db (median, min-max), worker CPU per task from
RUSAGE_CHILDREN. Not a test (django-tasks-db is not a dependency)::

    pip install django-tasks-db   # Python 3.12+, in the environment with graphile-worker
    createdb djbench
    cd bench/django
    python manage.py migrate && python manage.py graphile_worker --schema-only
    N=5000 ROUNDS=3 python bench.py
"""

import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchsettings")
import django

django.setup()
from benchapp.tasks import noop_db, noop_gw  # noqa: E402 (after setup)
from django.db import connection  # noqa: E402

N = int(os.environ.get("N", "5000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PY = sys.executable


def clean() -> None:
    with connection.cursor() as cur:
        cur.execute(
            "delete from graphile_worker._private_jobs;"
            "delete from graphile_worker._private_py_django_results;"
            "delete from graphile_worker._private_py_job_history;"
            "delete from graphile_worker._private_py_job_history_expiry;"
            "delete from django_tasks_database_dbtaskresult;"
        )


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def enqueue(task) -> float:
    start = time.perf_counter()
    for i in range(N):
        task.enqueue(i)
    return time.perf_counter() - start


def drain(command: list[str]) -> tuple[float, float]:
    before, start = cpu(), time.perf_counter()
    subprocess.run([PY, "manage.py", *command], check=True, capture_output=True)
    return time.perf_counter() - start, cpu() - before


SYSTEMS = {
    "graphile -j1": (noop_gw, ["graphile_worker", "--once", "-j", "1", "--progress-interval", "0"]),
    "graphile -j10": (
        noop_gw,
        ["graphile_worker", "--once", "-j", "10", "--progress-interval", "0"],
    ),
    "tasks-db": (noop_db, ["db_worker", "--batch", "--no-startup-delay", "--backend", "db"]),
}
results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in SYSTEMS}
for r in range(ROUNDS):
    order = list(SYSTEMS) if r % 2 == 0 else list(reversed(SYSTEMS))
    for name in order:
        task, command = SYSTEMS[name]
        clean()
        enq = enqueue(task)
        wall, used = drain(command)
        results[name].append((N / enq, N / wall, used / N * 1e6))
        print(
            f"round {r + 1} {name}: enqueue {N / enq:,.0f}/s, drain {N / wall:,.0f}/s, "
            f"worker CPU {used / N * 1e6:,.0f} us/task",
            flush=True,
        )

base = results["tasks-db"]
for name in SYSTEMS:
    rows = results[name]
    for index, label in ((0, "enqueue/s"), (1, "drain/s")):
        ratios = [a[index] / b[index] for a, b in zip(rows, base, strict=True)]
        print(
            f"{name} {label}: median {statistics.median(x[index] for x in rows):,.0f}, "
            f"vs tasks-db {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    ratios = [a[2] / b[2] for a, b in zip(rows, base, strict=True)]
    print(
        f"{name} CPU/task: median {statistics.median(x[2] for x in rows):,.0f} us, "
        f"vs tasks-db {statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
    )
