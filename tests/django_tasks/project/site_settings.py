"""Settings of the Django 6 test project: its database is DJANGO_DATABASE_URL,
a second alias ``bare`` (DJANGO_BARE_DATABASE_URL) has no schema."""

import os

from psycopg.conninfo import conninfo_to_dict


def _database(url: str) -> dict[str, object]:
    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", ""),
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
    }


SECRET_KEY = "test"
# DJANGO_DEBUG=1: DEBUG on (Django then logs to the console itself).
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
# DJANGO_USE_TZ=0: naive datetimes in TIME_ZONE (a test of that case).
USE_TZ = os.environ.get("DJANGO_USE_TZ", "1") == "1"
TIME_ZONE = "UTC" if USE_TZ else "Europe/Paris"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "site_urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["worker_cli.contrib.django", "jobsapp"]
DATABASES = {
    "default": _database(os.environ["DJANGO_DATABASE_URL"]),
    "bare": _database(os.environ.get("DJANGO_BARE_DATABASE_URL", "postgres:///bare")),
}
if os.environ.get("DJANGO_SQLITE") == "1":  # DJANGO_SQLITE=1: startproject's database
    DATABASES["default"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
TASKS = {
    "default": {
        "BACKEND": "worker_cli.contrib.django.GraphileWorkerBackend",
        "QUEUES": ["default", "emails"],
    },
    "bare": {
        "BACKEND": "worker_cli.contrib.django.GraphileWorkerBackend",
        "OPTIONS": {"database": "bare"},
    },
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.tasks": {"handlers": ["console"], "level": "DEBUG"}},
}
