"""The schedules in the database on the Crontab page (listed beside the
crontab's items, each with its state, last run, lag and next three runs in
UTC and in its zone; added, changed, paused, resumed and removed through the
utilities, behind the CSRF token, refused when read-only, a bad value
refused with the one line naming its field and nothing written), and a job's
progress and kept logs on its page, live or finished, escaped. Over HTTP."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from dashboard_helpers import COOKIE, SECRET, TOKEN, Reply, follow, http, serve_app
from dbhelpers import rows, value

from worker_cli import Helpers, make_sync_worker_utils, run_once
from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import Csrf

pytestmark = pytest.mark.db

SCHEDULES = "graphile_worker._private_py_schedules"
NEW_YORK, TOKYO = ZoneInfo("America/New_York"), ZoneInfo("Asia/Tokyo")

CRONTAB = """\
0 9 * * * morning_digest
30 4 * * 1 send_weekly_email ?fill=2d
"""


def stored(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        f"select identifier, pattern, task_identifier, payload, tz, fill, queue_name, priority, "
        f"max_attempts, job_key, paused, version from {SCHEDULES} order by identifier",
    )


@pytest.fixture
def schedules_db(db: str) -> str:
    """Three schedules (one in Tokyo, one in the default zone that ran 1.5 s
    late, one paused) and a crontab item a worker knows (not in CRONTAB)."""
    with make_sync_worker_utils(db) as utils:
        utils.add_schedule(
            "tokyo_report",
            "30 2 * * *",
            "nightly_report",
            {"kind": "<b>daily</b>"},
            tz="Asia/Tokyo",
            queue_name="reports",
            priority=3,
            fill="2d",
        )
        utils.add_schedule("ny_digest", "0 9 * * *", "digest")
        utils.add_schedule("held", "0 12 * * 1", "weekly", paused=True)
    rows(
        db,
        f"update {SCHEDULES} set last_execution = date_trunc('minute', now()) - interval '1 hour', "
        "last_run_at = date_trunc('minute', now()) - interval '1 hour' + interval '1.5 seconds' "
        "where identifier = 'ny_digest'",
    )
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs values "
        "('old_item', now() - interval '9 days', now() - interval '2 days')",
    )
    return db


@pytest.fixture
def url(schedules_db: str) -> Iterator[str]:
    app = create_app(
        schedules_db, csrf_secret=SECRET, crontab=CRONTAB, cron_timezone="America/New_York"
    )
    with serve_app(app) as base:
        yield base


def now(db: str) -> datetime:
    found: datetime = value(db, "select now()")
    return found


def next_dailies(at: time, zone: ZoneInfo, after: datetime, count: int = 3) -> list[datetime]:
    """The next ``count`` ``at`` of ``zone`` from ``after`` (a wall time that
    exists every day there), in UTC: worked out here, not by the worker's code."""
    found: list[datetime] = []
    day: date = after.astimezone(zone).date() - timedelta(days=1)
    while len(found) < count:
        instant = datetime.combine(day, at, tzinfo=zone).astimezone(UTC)
        if instant >= after:
            found.append(instant)
        day += timedelta(days=1)
    return found


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def schedule_cells(body: str, identifier: str) -> dict[str, str]:
    """The text of each cell (by its class) of the schedule's row."""
    row = re.search(rf'<tr data-schedule="{re.escape(identifier)}"[^>]*>(.*?)</tr>', body, re.S)
    assert row, body[-3000:]
    return {
        name: text_of(cell)
        for name, cell in re.findall(
            r'<td class="[^"]*?schedule-(\w+)[^"]*">(.*?)</td>', row.group(1), re.S
        )
    }


def next_items(cell_html: str) -> list[str]:
    return [text_of(item) for item in re.findall(r"<li[^>]*>(.*?)</li>", cell_html, re.S)]


def schedule_ids(body: str) -> list[str]:
    return re.findall(r'<tr data-schedule="([^"]+)"', body)


def post(url: str, fields: dict[str, str], cookie: str = COOKIE) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **fields}).encode()
    return http(url, data=body, headers={"Cookie": cookie})


def form_fields(**changes: str) -> dict[str, str]:
    fields = {
        "identifier": "weekly_digest",
        "pattern": "0 8 * * 1",
        "task": "send_digest",
        "payload": '{"list": "weekly", "limit": 50}',
        "tz": "Europe/Paris",
        "fill": "2d",
        "queue": "mail",
        "priority": "-2",
        "max_attempts": "4",
        "job_key": "",
    }
    return {**fields, **changes}


def test_the_page_lists_the_crontab_and_the_database_schedules(schedules_db: str, url: str) -> None:
    page = http(url + "/crontab")
    assert page.status == 200, page.body[-2000:]
    read_at = now(schedules_db)
    # The crontab file's items, each with its next three runs.
    assert re.findall(r'<tr data-item="([^"]+)">', page.body) == [
        "morning_digest",
        "send_weekly_email",
    ]
    item = re.search(r'<tr data-item="morning_digest">(.*?)</tr>', page.body, re.S)
    assert item is not None
    next_cell = re.search(r'<td class="cron-next">(.*?)</td>', item.group(1), re.S)
    assert next_cell is not None
    expected = next_dailies(time(9, 0), NEW_YORK, read_at)
    runs = next_items(next_cell.group(1))
    assert [run.split(" = ")[0] for run in runs] == [stamp(at) for at in expected]

    # The database's, in a table of their own, by identifier.
    assert schedule_ids(page.body) == ["held", "ny_digest", "tokyo_report"]
    tokyo = schedule_cells(page.body, "tokyo_report")
    assert tokyo["pattern"] == "30 2 * * *"
    assert tokyo["zone"] == "Asia/Tokyo"
    assert tokyo["state"] == "active"
    assert tokyo["last"].startswith("never (since")
    assert "queue reports · priority 3 · fill 2d" in tokyo["task"]
    # The payload is text: its HTML is escaped.
    assert '{"kind": "<b>daily</b>"}' in tokyo["task"]
    assert "<b>daily</b>" not in page.body and "&lt;b&gt;daily&lt;/b&gt;" in page.body
    row = re.search(r'<tr data-schedule="tokyo_report"[^>]*>(.*?)</tr>', page.body, re.S)
    assert row is not None
    cell = re.search(r'<td class="schedule-next">(.*?)</td>', row.group(1), re.S)
    assert cell is not None
    runs = next_items(cell.group(1))
    expected = next_dailies(time(2, 30), TOKYO, read_at)
    assert len(runs) == 3
    for run, at in zip(runs, expected, strict=True):
        assert run.startswith(f"{stamp(at)} = {at.astimezone(TOKYO):%Y-%m-%d %H:%M} JST"), run

    # No zone: UTC, as every worker fires it, whatever --cron-timezone
    # (New York here, the crontab items' default).
    digest = schedule_cells(page.body, "ny_digest")
    assert digest["zone"] == "UTC (default)"
    expected = next_dailies(time(9, 0), ZoneInfo("UTC"), read_at)
    assert digest["next"].startswith(stamp(expected[0]))
    assert digest["lag"] == "1.50s"
    assert digest["last"].endswith("(1h 00m ago)")

    held = schedule_cells(page.body, "held")
    assert (held["state"], held["next"]) == ("paused", "none while paused")
    assert 'id="schedule-default-zone">UTC<' in page.body
    # A crontab item a worker knows, not in the dashboard's crontab: apart, as before.
    others = re.search(r'<table class="grid" id="crontab-table">(.*?)</table>', page.body, re.S)
    assert others and "old_item" in others.group(1) and "tokyo_report" not in others.group(1)


def test_without_a_crontab_the_schedules_are_listed_in_utc(schedules_db: str) -> None:
    with serve_app(create_app(schedules_db, csrf_secret=SECRET)) as base:
        page = http(base + "/crontab")
    assert page.status == 200
    assert 'id="crontab-not-given"' in page.body
    digest = schedule_cells(page.body, "ny_digest")
    assert digest["zone"] == "UTC (default)"
    expected = next_dailies(time(9, 0), ZoneInfo("UTC"), now(schedules_db))
    assert digest["next"].startswith(stamp(expected[0]) + " (")  # no local time in UTC


def test_add_edit_pause_resume_and_remove(schedules_db: str, url: str) -> None:
    form = http(url + "/crontab/schedules/new", headers={"Cookie": COOKIE})
    assert form.status == 200 and 'id="schedule-form"' in form.body
    assert len(stored(schedules_db)) == 3  # a GET changes nothing

    added = post(url + "/crontab/schedules", form_fields())
    assert added.status == 303 and added.headers["location"] == "/crontab"
    page = follow(url, added, COOKIE)
    assert "Added schedule weekly_digest: Python workers fire it" in page.body
    [row] = [s for s in stored(schedules_db) if s["identifier"] == "weekly_digest"]
    assert row == {
        "identifier": "weekly_digest",
        "pattern": "0 8 * * 1",
        "task_identifier": "send_digest",
        "payload": {"list": "weekly", "limit": 50},
        "tz": "Europe/Paris",
        "fill": timedelta(days=2),
        "queue_name": "mail",
        "priority": -2,
        "max_attempts": 4,
        "job_key": None,
        "paused": False,
        "version": 1,
    }
    cells = schedule_cells(page.body, "weekly_digest")
    assert (cells["pattern"], cells["zone"], cells["state"]) == (
        "0 8 * * 1",
        "Europe/Paris",
        "active",
    )
    assert re.search(r"CES?T", cells["next"])  # its Paris wall time

    # Edit: the form filled with it, its identifier read-only; saving replaces it.
    edit = http(url + "/crontab/schedules/edit?schedule=weekly_digest", headers={"Cookie": COOKIE})
    assert edit.status == 200
    assert re.search(r'name="identifier" value="weekly_digest"[^>]*readonly', edit.body)
    assert 'name="replace" value="1"' in edit.body
    assert 'name="fill" value="2d"' in edit.body and 'name="priority" value="-2"' in edit.body
    payload = re.search(r'<textarea[^>]*name="payload"[^>]*>(.*?)</textarea>', edit.body, re.S)
    assert payload and json.loads(html.unescape(payload.group(1))) == {
        "list": "weekly",
        "limit": 50,
    }
    changed = post(
        url + "/crontab/schedules",
        form_fields(pattern="15 7 * * 1-5", tz="", payload="", replace="1"),
    )
    assert "Changed schedule weekly_digest" in follow(url, changed, COOKIE).body
    [row] = [s for s in stored(schedules_db) if s["identifier"] == "weekly_digest"]
    assert (row["pattern"], row["tz"], row["payload"], row["version"]) == (
        "15 7 * * 1-5",
        None,
        None,
        2,
    )
    # The add form does not replace a schedule of the same identifier.
    again = post(url + "/crontab/schedules", form_fields(pattern="* * * * *"))
    assert again.status == 400
    assert "identifier: &#39;weekly_digest&#39; is a schedule&#39;s already" in again.body
    assert stored(schedules_db)[-1]["pattern"] == "15 7 * * 1-5"

    paused = post(url + "/crontab/schedules/pause", {"schedule": "weekly_digest"})
    page = follow(url, paused, COOKIE)
    assert "Paused schedule weekly_digest" in page.body
    assert schedule_cells(page.body, "weekly_digest")["state"] == "paused"
    assert stored(schedules_db)[-1]["paused"] is True
    resumed = post(url + "/crontab/schedules/resume", {"schedule": "weekly_digest"})
    page = follow(url, resumed, COOKIE)
    assert "Resumed schedule weekly_digest" in page.body
    assert schedule_cells(page.body, "weekly_digest")["state"] == "active"
    assert stored(schedules_db)[-1]["paused"] is False

    confirm = http(
        url + "/crontab/schedules/remove?schedule=weekly_digest", headers={"Cookie": COOKIE}
    )
    assert confirm.status == 200 and 'id="confirm-form"' in confirm.body
    assert "weekly_digest" in schedule_ids(http(url + "/crontab").body)  # a GET
    removed = post(url + "/crontab/schedules/remove", {"schedule": "weekly_digest"})
    page = follow(url, removed, COOKIE)
    assert "Removed schedule weekly_digest" in page.body
    assert "weekly_digest" not in schedule_ids(page.body)
    assert [s["identifier"] for s in stored(schedules_db)] == ["held", "ny_digest", "tokyo_report"]
    gone = post(url + "/crontab/schedules/remove", {"schedule": "weekly_digest"})
    page = follow(url, gone, COOKIE)
    assert 'data-outcome="refused"' in page.body and "does not exist" in page.body
    assert (
        http(url + "/crontab/schedules/edit?schedule=nosuch", headers={"Cookie": COOKIE}).status
        == 404
    )


BIG = json.dumps({"blob": "x" * (70 * 1024)})
BIG_SIZE = len(json.dumps(json.loads(BIG), separators=(",", ":")))


@pytest.mark.parametrize(
    ("changes", "field", "said"),
    [
        ({"pattern": "61 * * * *"}, "pattern", "pattern: minute value 61 in '61' is out of range"),
        ({"pattern": "0 0 31 2 *"}, "pattern", "pattern: '0 0 31 2 *' never fires"),
        ({"tz": "Mars/Olympus"}, "tz", "time zone: unknown time zone 'Mars/Olympus'"),
        ({"payload": "[1, 2]"}, "payload", "payload: is a JSON array; a schedule's payload is"),
        ({"payload": "{not json"}, "payload", "payload: not JSON: Expecting property name"),
        (
            {"payload": BIG},
            "payload",
            f"payload: is {BIG_SIZE:,} bytes of JSON; a schedule's payload is at most 65,536",
        ),
        ({"fill": "2x"}, "fill", "fill: invalid time phrase '2x'"),
        ({"priority": "high"}, "priority", "priority: not a whole number: 'high'"),
        ({"max_attempts": "0"}, "max_attempts", "max attempts: must be between 1 and 32767"),
        ({"identifier": "a b"}, "identifier", "identifier: is 'a b'; it must start with"),
        (
            {"identifier": "morning_digest"},
            "identifier",
            "identifier: 'morning_digest' is the identifier of an item of the dashboard's "
            "crontab (line 1)",
        ),
        ({"identifier": "old_item"}, "identifier", "identifier: 'old_item' is a crontab item's"),
        ({"task": ""}, "task", "task: invalid task identifier ''"),
    ],
)
def test_a_bad_value_shows_the_form_again_naming_it_and_writes_nothing(
    schedules_db: str, url: str, changes: dict[str, str], field: str, said: str
) -> None:
    before = stored(schedules_db)
    reply = post(url + "/crontab/schedules", form_fields(**changes))
    assert reply.status == 400, reply.body[-1500:]
    error = re.search(
        r'<div class="notice notice-warn" id="form-error"[^>]*>(.*?)</div>', reply.body, re.S
    )
    assert error, reply.body[-1500:]
    assert text_of(error.group(1)).startswith(said), text_of(error.group(1))
    assert f'data-field="{field}"' in reply.body
    # The field is marked, and the form keeps what was sent.
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', reply.body)
    shown = re.search(r'name="pattern"[^>]* value="([^"]*)"', reply.body)
    assert shown and html.unescape(shown.group(1)) == form_fields(**changes)["pattern"]
    assert stored(schedules_db) == before


def test_actions_need_the_csrf_token(schedules_db: str, url: str) -> None:
    before = stored(schedules_db)
    for path, fields in [
        ("/crontab/schedules", form_fields()),
        ("/crontab/schedules/pause", {"schedule": "ny_digest"}),
        ("/crontab/schedules/resume", {"schedule": "held"}),
        ("/crontab/schedules/remove", {"schedule": "ny_digest"}),
    ]:
        bare = http(url + path, data=urlencode(fields).encode(), headers={"Cookie": COOKIE})
        wrong = post(url + path, {**fields, "csrf_token": "0" * 64})
        other = post(url + path, fields, cookie=f"{Csrf.COOKIE}=other")
        assert [bare.status, wrong.status, other.status] == [403, 403, 403], path
        assert "security token" in bare.body
    assert stored(schedules_db) == before


def test_read_only_shows_no_action_and_refuses_them(schedules_db: str) -> None:
    before = stored(schedules_db)
    app = create_app(schedules_db, csrf_secret=SECRET, crontab=CRONTAB, read_only=True)
    with serve_app(app) as base:
        page = http(base + "/crontab")
        assert page.status == 200 and schedule_ids(page.body) == [
            "held",
            "ny_digest",
            "tokyo_report",
        ]
        # No button, no form of the schedules' actions.
        for marker in (
            'id="schedule-add"',
            "schedule-edit",
            "/crontab/schedules/pause",
            "/crontab/schedules/resume",
            "/crontab/schedules/remove",
        ):
            assert marker not in page.body, marker
        for path in (
            "/crontab/schedules/new",
            "/crontab/schedules/edit?schedule=ny_digest",
            "/crontab/schedules/remove?schedule=ny_digest",
        ):
            assert http(base + path, headers={"Cookie": COOKIE}).status == 403, path
        for path, fields in [
            ("/crontab/schedules", form_fields()),
            ("/crontab/schedules/pause", {"schedule": "ny_digest"}),
            ("/crontab/schedules/resume", {"schedule": "held"}),
            ("/crontab/schedules/remove", {"schedule": "ny_digest"}),
        ]:
            reply = post(base + path, fields)
            assert reply.status == 403 and "read-only" in reply.body, path
    assert stored(schedules_db) == before


# --- a job's progress and logs ------------------------------------------------

PROGRESS = "graphile_worker._private_py_job_progress"
LOGS = "graphile_worker._private_py_job_logs"


def add_job(db: str, task: str, **options: Any) -> int:
    with make_sync_worker_utils(db) as utils:
        return utils.add_job(task, {}, **options).id


def test_a_live_jobs_page_shows_its_progress_and_its_logs(db: str) -> None:
    job_id = add_job(db, "import_rows", max_attempts=5)
    rows(
        db,
        f"insert into {PROGRESS} (job_id, done, total, message, updated_at) "
        "values (%s, 1250, 5000, 'rows of <i>customers</i>', now() - interval '3 seconds')",
        (job_id,),
    )
    rows(
        db,
        f"insert into {LOGS} (job_id, attempt, outcome, logged_at, lines, dropped) values "
        "(%(id)s, 1, 'failed', now() - interval '2 minutes', %(first)s, 0), "
        "(%(id)s, 2, 'failed', now() - interval '1 minute', %(second)s, 3)",
        {
            "id": job_id,
            "first": "2026-01-01T00:00:00.000Z INFO starting\n"
            "2026-01-01T00:00:01.000Z ERROR <script>alert(1)</script>\nTraceback (most recent "
            "call last):",
            "second": "[3 earlier line(s) dropped: an attempt keeps at most 1000 lines, 64 KiB]\n"
            "2026-01-01T00:01:00.000Z WARNING slow <b>answer</b>",
        },
    )
    with serve_app(create_app(db, csrf_secret=SECRET, refresh=0)) as base:
        page = http(base + f"/jobs/{job_id}")
    assert page.status == 200, page.body[-2000:]
    assert 'id="job-progress-bar" max="1" value="0.2500"' in page.body
    figures = re.search(r'id="job-progress-figures">(.*?)</span>\s*</div>', page.body, re.S)
    assert figures and text_of(figures.group(1)) == "25% · 1,250 of 5,000"
    assert "rows of &lt;i&gt;customers&lt;/i&gt;" in page.body
    updated = re.search(r'id="job-progress-updated">(.*?)</p>', page.body, re.S)
    assert updated and re.fullmatch(
        r"Reported by its task at \S+ \S+ UTC \([345]s ago\) \.", text_of(updated.group(1))
    ), updated.group(1)

    # Each kept attempt in a <details>, newest first, the newest open.
    attempts = re.findall(
        r'<details class="job-log" id="job-log-\d+" data-attempt="(\d+)"( open)?>', page.body
    )
    assert attempts == [("2", " open"), ("1", "")]
    summaries = [text_of(s) for s in re.findall(r"<summary>(.*?)</summary>", page.body, re.S)]
    assert (
        summaries[0].startswith("Attempt 2 failed") and "1 line, 3 earlier dropped" in summaries[0]
    )
    assert "2 lines" in summaries[1]
    # Escaped: a line is text, never markup.
    assert "<script>alert(1)</script>" not in page.body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.body
    assert '<span class="log-line log-error">Traceback (most recent call last):</span>' in page.body
    assert '<span class="log-line log-note">[3 earlier line(s) dropped' in page.body


def test_a_job_without_progress_or_logs_says_so(db: str) -> None:
    job_id = add_job(db, "quiet")
    with serve_app(create_app(db, csrf_secret=SECRET, refresh=0)) as base:
        page = http(base + f"/jobs/{job_id}")
    assert page.status == 200
    assert 'id="job-progress"' not in page.body
    assert 'id="job-logs-none"' in page.body


async def reports_and_succeeds(payload: Any, helpers: Helpers) -> None:
    helpers.progress(7, 10, "step <7>")
    helpers.logger.info("reading <script>alert(2)</script>")
    await asyncio.sleep(0.8)  # past the progress writer's next write


def test_a_finished_jobs_page_shows_its_last_progress_and_its_logs(db: str) -> None:
    """A job that succeeded (its record in the history), run by a worker
    keeping every attempt's lines (``--job-logs all``)."""
    job_id = add_job(db, "reports")

    async def drain() -> None:
        async with asyncio.timeout(60):
            tasks = {"reports": reports_and_succeeds}
            assert await run_once(db, task_list=tasks, no_handle_signals=True, job_logs="all") == 0

    asyncio.run(drain())
    history = "select state from graphile_worker._private_py_job_history where job_id = %s"
    assert value(db, history, (job_id,)) == "succeeded"
    with serve_app(create_app(db, csrf_secret=SECRET, refresh=0)) as base:
        page = http(base + f"/jobs/{job_id}")
    assert page.status == 200 and "the job itself is gone" in page.body
    assert 'id="job-progress-bar" max="1" value="0.7000"' in page.body
    assert "step &lt;7&gt;" in page.body
    updated = re.search(r'id="job-progress-updated">(.*?)</p>', page.body, re.S)
    assert updated and text_of(updated.group(1)).startswith("Its last report, at")
    summary = re.search(r'data-attempt="1" open>\s*<summary>(.*?)</summary>', page.body, re.S)
    assert summary and text_of(summary.group(1)).startswith("Attempt 1 succeeded")
    assert "INFO reading &lt;script&gt;alert(2)&lt;/script&gt;" in page.body
    assert "<script>alert(2)</script>" not in page.body
