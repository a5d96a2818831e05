"""The Django guide's second part (docs/guides/django.md, "The backend in
full"), run as written: its settings, model, tasks, views and ASGI
application in a new project, its commands as a user types them (on a
database without the schema)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from dbhelpers import value
from pg_server import PgServer

pytestmark = pytest.mark.db

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "django.md").read_text(
    encoding="utf-8"
)

BASE_SETTINGS = """\
import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["DATABASE_URL"])
SECRET_KEY = "guide"
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
ALLOWED_HOSTS = ["testserver"]  # Django's test client
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "shop",
]
# As startproject has them: CSRF protection on.
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}
"""

PROJECT_FILES = {
    "manage.py": """\
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
""",
    "mysite/__init__.py": "",
    "shop/__init__.py": "",
}

#: What the project's user does next, from Python, as a script the guide's
#: way (the csrftoken cookie's value in X-CSRFToken; refused without it): an
#: order placed (its task enqueued), a request that fails inside atomic()
#: (nothing enqueued).
PLACE_ORDERS = """\
import django, json
django.setup()
from django.middleware.csrf import get_token
from django.test import Client, RequestFactory
client = Client(raise_request_exception=False, enforce_csrf_checks=True)
refused = client.post("/orders/", {"item": "book"}).status_code
request = RequestFactory().get("/")
token = get_token(request)  # what a page's {% csrf_token %} holds
client.cookies["csrftoken"] = request.META["CSRF_COOKIE"]  # and the cookie it set
placed = client.post("/orders/", {"item": "book"}, headers={"X-CSRFToken": token}).json()
failed = client.post("/orders/", {}, headers={"X-CSRFToken": token}).status_code
print(json.dumps({"placed": placed, "failed": failed, "refused": refused}))
"""

#: Then: the receipt's status through a view, and the ASGI application of the
#: guide (the dashboard for staff only, Django's views beside it).
READ_BACK = """\
import asyncio, django, json, sys
django.setup()
import httpx
from django.contrib.auth.models import User
from django.test import Client
from mysite.asgi import application

task_id = sys.argv[1]
client = Client()
receipt = client.get(f"/receipts/{task_id}/").json()
staff = User.objects.create_user("ops", password="x", is_staff=True)
client.force_login(staff)
session = client.cookies["sessionid"].value


async def through_asgi():
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        anonymous = await http.get("/admin/queue/")
        as_staff = await http.get("/admin/queue/", cookies={"sessionid": session})
        view = await http.get(f"/receipts/{task_id}/")
    return anonymous.status_code, as_staff.status_code, as_staff.text, view.json()


anonymous, as_staff, page, view = asyncio.run(through_asgi())
print(json.dumps({"receipt": receipt, "anonymous": anonymous, "staff": as_staff,
                  "dashboard": "graphile-worker" in page, "view": view}))
"""


def section() -> str:
    start = GUIDE.index("\n## The backend in full\n")
    end = GUIDE.find("\n## ", start + 1)
    return GUIDE[start:] if end == -1 else GUIDE[start:end]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), flags=re.S)


def python_files() -> dict[str, str]:
    """The section's ``# path`` blocks, by path."""
    found = {}
    for block in blocks("python"):
        first = block.splitlines()[0]
        match = re.fullmatch(r"# ([\w/]+\.py)( \(added\))?", first)
        if match:
            found[match.group(1)] = block
    return found


def run(command: list[str], directory: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


def test_the_guide_backend_in_full(pg: PgServer, tmp_path: Path) -> None:
    url = pg.url(pg.create_database())
    files = python_files()
    assert set(files) == {
        "mysite/settings.py",
        "shop/models.py",
        "shop/tasks.py",
        "shop/views.py",
        "mysite/urls.py",
        "mysite/asgi.py",
    }
    project = {**PROJECT_FILES, **files}
    project["mysite/settings.py"] = BASE_SETTINGS + "\n" + files["mysite/settings.py"]
    for name, text in project.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "DJANGO"))}
    env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="mysite.settings", PYTHONPATH="")
    python = [sys.executable]

    transcript = blocks("text")[0].splitlines()
    commands = [line.removeprefix("$ ") for line in transcript if line.startswith("$ ")]
    assert commands == [
        "python manage.py graphile_worker --schema-only",
        "python manage.py graphile_worker --queue-name '*' --once",
    ]
    schema_only = shlex.split(commands[0])
    out = run(python + schema_only[1:], tmp_path, env)
    assert out.strip() == transcript[1]  # "Schema 'graphile_worker' migrated to revision 20."
    run([*python, "manage.py", "migrate", "--run-syncdb", "-v", "0"], tmp_path, env)
    run([*python, "manage.py", "check", "--database", "default"], tmp_path, env)

    orders = json.loads(run([*python, "-c", PLACE_ORDERS], tmp_path, env))
    assert orders["refused"] == 403  # no CSRF token
    assert orders["failed"] == 500  # KeyError inside atomic(): no order, no task
    task_id = orders["placed"]["task_id"]
    assert value(url, "select count(*) from graphile_worker._private_jobs") == 1
    assert value(url, "select count(*) from shop_order") == 1

    run(python + shlex.split(commands[1])[1:], tmp_path, env)
    read = json.loads(run([*python, "-c", READ_BACK, task_id], tmp_path, env))
    expected = {"status": "SUCCESSFUL", "value": "receipt for order 1 sent"}
    assert read["receipt"] == expected and read["view"] == expected
    assert (read["anonymous"], read["staff"], read["dashboard"]) == (403, 200, True)
