"""Settings of the Django Tasks benchmark (bench.py): both backends on one
database, BENCH_DATABASE_URL (default postgres://postgres@127.0.0.1/djbench)."""

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(
    os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1/djbench")
)
SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["worker_cli.contrib.django", "django_tasks_db", "benchapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "djbench"),
        "USER": _db.get("user", "postgres"),
        "HOST": _db.get("host", "127.0.0.1"),
        "PORT": _db.get("port", "5432"),
    }
}
TASKS = {
    "default": {"BACKEND": "worker_cli.contrib.django.GraphileWorkerBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
