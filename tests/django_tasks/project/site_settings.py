"""Settings of the Django 6 test project: its database is DJANGO_DATABASE_URL,
a second alias ``bare`` (DJANGO_BARE_DATABASE_URL) has no schema. Django's
admin is installed (at /admin/, with the queue's pages), unless
DJANGO_NO_ADMIN=1: a project without it."""

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
# DJANGO_NO_ADMIN=1: no admin, no auth (the app's models are there all the same).
ADMIN = os.environ.get("DJANGO_NO_ADMIN") != "1"
if ADMIN:
    INSTALLED_APPS += [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    STATIC_URL = "static/"
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
# DJANGO_GRAPHILE_SCHEMA: the default backend's schema (default graphile_worker).
if os.environ.get("DJANGO_GRAPHILE_SCHEMA"):
    TASKS["default"]["OPTIONS"] = {"schema": os.environ["DJANGO_GRAPHILE_SCHEMA"]}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django.tasks": {"handlers": ["console"], "level": "DEBUG"}},
}
