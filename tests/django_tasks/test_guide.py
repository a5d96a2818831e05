"""The Django guide's first part (docs/guides/django.md, "From startproject to
a first task"), followed as written: its commands run in an empty folder as a
user types them, its files written where they say, the page's form submitted
as a browser does, and what the guide shows compared with what happens."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pg_server import PgServer
from psycopg.conninfo import conninfo_to_dict

pytestmark = pytest.mark.db

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "django.md").read_text(
    encoding="utf-8"
)
BIN = str(Path(sys.executable).parent)

#: What a browser does at the guide's "open ... and press the button" and
#: "open .../receipts/TASK_ID/": the page, its form posted with its token.
BROWSER = """\
import json, os, re, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")  # as manage.py does
django.setup()
from django.test import Client

browser = Client(enforce_csrf_checks=True, HTTP_HOST="127.0.0.1")
if sys.argv[1] == "order":
    refused = browser.post("/order/", {"order_id": "1"}).status_code
    page = browser.get("/order/").content.decode()
    form = dict(re.findall(r'name="(\\w+)" value="([^"]*)"', page))
    answer = browser.post("/order/", form)
    print(json.dumps({"refused": refused, "status": answer.status_code, "body": answer.json()}))
else:
    print(json.dumps(browser.get(f"/receipts/{sys.argv[2]}/").json()))
"""


def first_part() -> str:
    start = GUIDE.index("\n## From `startproject` to a first task\n")
    end = GUIDE.index("\n## ", start + 1)
    return GUIDE[start:end]


def steps() -> list[tuple[str, str]]:
    """The part's code blocks in order: (language, text)."""
    return re.findall(r"```(\w+)\n(.*?)```", first_part(), flags=re.S)


def commands(transcript: str) -> list[tuple[str, list[str]]]:
    """A transcript's ``$`` lines, each with the lines shown after it."""
    found: list[tuple[str, list[str]]] = []
    for line in transcript.splitlines():
        if line.startswith("$ "):
            found.append((line, []))
        else:
            found[-1][1].append(line)
    return found


def shown(output: str, expected: list[str]) -> None:
    """The lines the guide shows are in ``output`` in that order (blank lines
    and indentation aside; ``...`` stands for any text, a ``...`` line for
    any lines)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    at = 0
    for line in expected:
        if line.strip() in ("", "..."):
            continue
        pattern = re.compile(".*".join(map(re.escape, line.strip().split("..."))) + "$")
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        assert at < len(lines), f"{line!r} not shown in order in:\n{output}"
        at += 1


def with_this_database(block: str, url: str) -> str:
    """The settings block with the test's database in place of the guide's."""
    params = conninfo_to_dict(url)
    for key, guide, ours in (
        ("NAME", "mysite", params["dbname"]),
        ("USER", "postgres", params.get("user", "")),
        ("HOST", "localhost", params.get("host", "")),
        ("PORT", "5432", params.get("port", "")),
    ):
        written = f'"{key}": "{guide}",'
        assert block.count(written) == 1, (written, block)
        block = block.replace(written, f'"{key}": {str(ours)!r},')
    return block


def test_the_guide_from_startproject_on(pg: PgServer, tmp_path: Path) -> None:
    url = pg.url(pg.create_database())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "DJANGO"))}
    env.update(PATH=BIN + os.pathsep + env.get("PATH", ""), PYTHONPATH="")
    here = tmp_path
    ran: list[str] = []
    responses: list[object] = []
    task_id = ""

    def run(command: list[str], stdout_only: bool = False) -> str:
        done = subprocess.run(
            command, cwd=here, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        return done.stdout if stdout_only else done.stdout + done.stderr

    def browse(*args: str) -> object:
        return json.loads(run([sys.executable, "-c", BROWSER, *args], stdout_only=True))

    for lang, text in steps():
        if lang == "bash":  # the install: done already
            assert text.startswith("pip install '.[django]'")
        elif lang == "console":
            # Each command, then the lines the guide shows for it.
            for line, expected in commands(text):
                command = shlex.split(line.removeprefix("$ "))
                ran.append(line)
                if command[0] == "cd":
                    here = here / command[1]
                    continue
                if command[1:] == ["manage.py", "runserver"]:
                    continue  # the browser steps below use the project's own handler
                output = run([sys.executable, *command[1:]] if command[0] == "python" else command)
                shown(output, expected)
                if command[1:3] == ["manage.py", "graphile_worker"]:
                    # startproject's DEBUG = True: each log line once.
                    assert output.count("state=SUCCESSFUL") <= 1, output
        elif lang in ("python", "html"):
            first = text.splitlines()[0]
            match = re.fullmatch(r"(?:# |<!-- )([\w/.]+)( \(at the end\))?(?: -->)?", first)
            assert match, first
            path = here / match.group(1)
            if match.group(1) == "mysite/settings.py":
                text = with_this_database(text, url)
            if match.group(2):
                assert path.exists(), path
                text = path.read_text(encoding="utf-8") + "\n" + text
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        elif lang == "json":
            expected = json.loads(text)
            if "task_id" in expected:
                order = browse("order")
                assert isinstance(order, dict)
                assert order["refused"] == 403  # no token: CSRF
                assert order["status"] == 200 and set(order["body"]) == {"task_id"}
                task_id = order["body"]["task_id"]
                responses.append(order["body"])
            else:
                got = browse("receipt", task_id)
                assert got == expected
                responses.append(got)
        elif lang == "text":  # an error, with startproject's SQLite
            ((line, expected),) = commands(text)
            settings = here / "mysite" / "settings.py"
            ours = settings.read_text(encoding="utf-8")
            start = ours.rindex("\nDATABASES = {\n")  # the guide's, left out
            end = ours.index("\n}\n", start) + 3
            settings.write_text(ours[:start] + ours[end:], encoding="utf-8")
            done = subprocess.run(
                [sys.executable, *shlex.split(line.removeprefix("$ "))[1:]],
                cwd=here, env=env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            settings.write_text(ours, encoding="utf-8")
            assert (done.returncode, done.stdout, done.stderr.splitlines()) == (1, "", expected)
        else:
            raise AssertionError(f"a block the test does not follow: {lang}")

    assert ran == [
        "$ django-admin startproject mysite",
        "$ cd mysite",
        "$ python manage.py startapp shop",
        "$ python manage.py check",
        "$ python manage.py migrate",
        "$ python manage.py graphile_worker --schema-only",
        "$ python manage.py check",
        "$ python manage.py runserver",
        "$ python manage.py graphile_worker --once",
    ]
    assert responses[1:] == [
        {"status": "READY", "value": None},
        {"status": "SUCCESSFUL", "value": "receipt for order 1 sent"},
    ]
