"""Pauses in the dashboard, over HTTP: the overview lists the pauses in force
and flags the paused queues and tasks; its form pauses (through
WorkerUtils.pause, checked as the utilities check), a button resumes; the
outcome is the one-time banner, and bad input is refused with one line
naming the field, writing nothing; read-only hides and refuses both."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import COOKIE, SECRET, TOKEN, Reply, follow, http, serve_app
from dashboard_notices import assert_done, assert_refused, banner
from dbhelpers import rows, value

from worker_cli.dashboard import create_app

pytestmark = pytest.mark.db

PAUSES = "graphile_worker._private_py_pauses"


def post(url: str, fields: dict[str, str], *, token: str | None = TOKEN) -> Reply:
    body = urlencode({**({"csrf_token": token} if token else {}), **fields}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def after(base: str, reply: Reply) -> Reply:
    """The page an action's redirect leads to (the overview), as the browser gets it."""
    assert reply.headers["location"] == "/", reply.headers["location"]
    return follow(base, reply, COOKIE)


def pauses(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        f"select kind, name, reason, hold_queue_lock, resume_at - paused_at as length, "
        f"resume_at from {PAUSES} order by kind, name",
    )


def overview(url: str) -> str:
    page = http(url + "/", headers={"Cookie": COOKIE})
    assert page.status == 200, page.body[-600:]
    return page.body


def pause_row(page: str, kind: str, name: str) -> str | None:
    """The text of the pauses table's row of ``kind:name`` (None: no such row)."""
    found = re.search(rf'<tr data-pause="{kind}:{re.escape(name)}">(.*?)</tr>', page, re.DOTALL)
    return None if found is None else re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found[1]))


def flagged(page: str, table: str) -> list[str]:
    """The names a table of the overview (tasks-table, queues-table) flags as paused."""
    [body] = re.findall(rf'<table class="grid" id="{table}">(.*?)</table>', page, re.DOTALL)
    return re.findall(r">([^<>]+)</a> <span class=\"badge badge-paused\"", body)


def test_pause_from_the_form_and_resume(db: str, url: str) -> None:
    rows(db, "select graphile_worker.add_job('send_email', queue_name => 'mail')")
    rows(db, "select graphile_worker.add_job('charge')")
    page = overview(url)
    assert 'id="no-pauses"' in page and 'id="pause-form"' in page
    assert flagged(page, "tasks-table") == [] and flagged(page, "queues-table") == []

    done = post(
        url + "/pauses",
        {
            "kind": "queue",
            "name": "mail",
            "for": "10m",
            "until": "",
            "reason": "deploy <b>v2</b>",
            "hold_queue_lock": "on",
        },
    )
    assert done.status == 303
    shown = after(url, done)
    assert_done(shown, "Paused queue mail: Python workers start none of its jobs")
    [row] = pauses(db)
    assert (row["kind"], row["name"], row["reason"], row["hold_queue_lock"]) == (
        "queue",
        "mail",
        "deploy <b>v2</b>",
        True,
    )
    assert row["length"] == timedelta(minutes=10)
    listed = pause_row(shown.body, "queue", "mail")
    assert listed is not None and "held off" in listed and "in 9m" in listed, listed
    assert "deploy &lt;b&gt;v2&lt;/b&gt;" in shown.body  # the reason is text
    assert flagged(shown.body, "queues-table") == ["mail"]
    assert flagged(shown.body, "tasks-table") == []
    assert "held for its pause" in shown.body  # the queue's lock, held as py:paused
    # The pools page shows that holder without offering to unlock it.
    pools = http(url + "/pools").body
    assert 'data-pool="py:paused"' in pools and "pool=py%3Apaused" not in pools

    until = "2099-01-02T03:04:05"
    shown = after(url, post(url + "/pauses", {"kind": "task", "name": "*", "until": until}))
    assert_done(shown, "Paused every task")
    assert [(r["kind"], r["name"]) for r in pauses(db)] == [("queue", "mail"), ("task", "*")]
    assert pauses(db)[1]["resume_at"] == datetime(2099, 1, 2, 3, 4, 5, tzinfo=UTC)
    listed = pause_row(shown.body, "task", "*")
    assert listed is not None and "every task" in listed and "not held off" in listed, listed
    assert flagged(shown.body, "tasks-table") == ["charge", "send_email"]

    shown = after(url, post(url + "/pauses/resume", {"kind": "queue", "name": "mail"}))
    assert_done(shown, "Resumed queue mail")
    assert [(r["kind"], r["name"]) for r in pauses(db)] == [("task", "*")]
    assert pause_row(shown.body, "queue", "mail") is None
    held = "select count(*) from graphile_worker._private_job_queues where locked_by is not null"
    assert value(db, held) == 0
    again = after(url, post(url + "/pauses/resume", {"kind": "queue", "name": "mail"}))
    assert_refused(again, "Queue mail was not paused")

    shown = after(url, post(url + "/pauses/resume", {"kind": "task", "name": "*"}))
    assert_done(shown, "Resumed every task")
    assert pauses(db) == []
    assert 'id="no-pauses"' in shown.body


def test_an_ended_pause_is_not_shown(db: str, url: str) -> None:
    rows(db, "select graphile_worker.add_job('charge')")
    rows(
        db,
        f"insert into {PAUSES} (kind, name, resume_at) values "
        "('task', 'charge', now() - interval '1 second'), ('queue', 'mail', null)",
    )
    page = overview(url)
    assert pause_row(page, "task", "charge") is None
    assert pause_row(page, "queue", "mail") is not None
    assert flagged(page, "tasks-table") == []


LATER = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")

BAD: list[tuple[dict[str, str], str]] = [
    ({"kind": "queue", "name": ""}, "Name: give a queue's name or a task identifier"),
    ({"kind": "queue", "name": "   "}, "Name: give a queue's name"),
    ({"kind": "topic", "name": "mail"}, "Kind: choose queue or task, not 'topic'"),
    ({"name": "mail"}, "Kind: choose queue or task, not ''"),
    ({"kind": "queue", "name": "q" * 129}, "Name: 'qqqq"),
    ({"kind": "queue", "name": "ma\x00il"}, "Name: 'ma\\x00il' contains a NUL character"),
    ({"kind": "queue", "name": "mail", "for": "soon"}, "For: 'soon' is not a length such as"),
    ({"kind": "queue", "name": "mail", "for": "0s"}, "For: '0s': a pause lasts above 0"),
    ({"kind": "queue", "name": "mail", "for": "367d"}, "at most 366 days"),
    ({"kind": "queue", "name": "mail", "for": "1h", "until": LATER}, "For: give a length or"),
    ({"kind": "queue", "name": "mail", "until": "tomorrow"}, "Until: not a date and time"),
    ({"kind": "queue", "name": "mail", "until": "2001-01-01T00:00"}, "has passed already"),
    ({"kind": "queue", "name": "mail", "until": "10000-01-01T00:00"}, "Until: not a date"),
    ({"kind": "queue", "name": "mail", "reason": "r" * 1001}, "Reason: 1,001 characters"),
    ({"kind": "queue", "name": "mail", "reason": "a\x00"}, "Reason: 'a\\x00' contains a NUL"),
    (
        {"kind": "task", "name": "charge", "hold_queue_lock": "on"},
        "Hold off Node workers: holds one named queue's lock",
    ),
    (
        {"kind": "queue", "name": "*", "hold_queue_lock": "on"},
        "it cannot hold a task or '*'",
    ),
]


@pytest.mark.parametrize(("fields", "says"), BAD, ids=[says for _, says in BAD])
def test_bad_input_is_refused_with_one_line_naming_the_field(
    db: str, url: str, fields: dict[str, str], says: str
) -> None:
    reply = post(url + "/pauses", fields)
    assert reply.status == 303, reply.body[-600:]
    page = after(url, reply)
    assert page.status == 200
    assert_refused(page, says)
    shown = banner(page)
    assert shown is not None
    text = shown[2]
    assert "\n" not in text and text.endswith(". Nothing was changed."), text
    assert len(text) < 300, text
    assert "Traceback" not in page.body
    assert pauses(db) == []


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "queues", "name": "mail"}, "Kind: choose queue or task"),
        ({"kind": "task", "name": ""}, "Name: give"),
        ({"kind": "task", "name": "x\x00"}, "NUL character"),
    ],
)
def test_a_resume_of_bad_values_is_refused(
    db: str, url: str, fields: dict[str, str], says: str
) -> None:
    rows(db, "select graphile_worker.py_pause('task', 'x')")
    assert_refused(after(url, post(url + "/pauses/resume", fields)), says)
    assert len(pauses(db)) == 1


def test_a_post_without_its_token_or_from_elsewhere_writes_nothing(db: str, url: str) -> None:
    rows(db, "select graphile_worker.py_pause('task', 'kept')")
    fields = {"kind": "queue", "name": "mail"}
    for reply in (
        post(url + "/pauses", fields, token=None),
        post(url + "/pauses", fields, token="0" * 64),
        post(url + "/pauses/resume", {"kind": "task", "name": "kept"}, token=None),
    ):
        assert reply.status == 403 and "security token" in reply.body
    cross = http(
        url + "/pauses",
        data=urlencode({"csrf_token": TOKEN, **fields}).encode(),
        headers={"Cookie": COOKIE, "Origin": "http://evil.example"},
    )
    assert cross.status == 403 and "another site" in cross.body
    assert http(url + "/pauses").status == 405  # a link cannot pause
    assert [r["name"] for r in pauses(db)] == ["kept"]


def test_read_only_shows_the_pauses_and_refuses_to_change_them(db: str) -> None:
    rows(db, "select graphile_worker.py_pause('queue', 'mail', reason => 'deploy')")
    with serve_app(create_app(db, read_only=True, csrf_secret=SECRET)) as url:
        page = overview(url)
        listed = pause_row(page, "queue", "mail")
        assert listed is not None and "deploy" in listed
        assert 'id="pause-form"' not in page and "/pauses/resume" not in page
        paused = post(url + "/pauses", {"kind": "task", "name": "charge"})
        resumed = post(url + "/pauses/resume", {"kind": "queue", "name": "mail"})
        for reply in (paused, resumed):
            assert reply.status == 403 and "read-only" in reply.body
    assert [(r["kind"], r["name"]) for r in pauses(db)] == [("queue", "mail")]
