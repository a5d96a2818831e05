"""The Crontab page: each item of the crontab given to the dashboard with its
schedule as written, its time zone, its last run (``_private_known_crontabs``)
and its next run (the worker's own instants, in the item's zone), and "Run
now" (the item's job, added as cron adds it, behind the CSRF token and a
confirmation; refused when read-only). Over HTTP, and in Chromium."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from dashboard_helpers import (
    COOKIE,
    SECRET,
    TOKEN,
    Reply,
    chromium,
    click,
    console_errors,
    follow,
    http,
    serve_app,
    serve_cli,
    wait_for,
)
from dbhelpers import rows, run_cli, value
from selenium.webdriver.common.by import By

from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import Csrf
from worker_cli.jobs.crontab import parse_crontab

pytestmark = pytest.mark.db


CRONTAB = """\
# m h dom mon dow task options payload
30 4 * * 1   send_weekly_email ?fill=2d&max=10&priority=3 {onboarding: false}
30  2 * * * nightly_report ?id=nightly_tokyo&tz=Asia/Tokyo&queue=reports
0 9 * * * morning_digest
0 0 31 2 * never_runs
"""


def known(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "select identifier, known_since, last_execution "
        "from graphile_worker._private_known_crontabs order by identifier",
    )


@pytest.fixture
def crontab_db(db: str) -> str:
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs values "
        "('send_weekly_email', now() - interval '9 days', now() - interval '2 days'), "
        "('nightly_tokyo', now() - interval '1 day', null), "
        "('<i>removed</i>', now() - interval '30 days', now() - interval '3 hours')",
    )
    return db


@pytest.fixture
def url(crontab_db: str) -> Iterator[str]:
    app = create_app(
        crontab_db, csrf_secret=SECRET, crontab=CRONTAB, cron_timezone="America/New_York"
    )
    with serve_app(app) as base:
        yield base


def now(db: str) -> datetime:
    found: datetime = value(db, "select now()")
    return found


def next_daily(at: time, zone: ZoneInfo, after: datetime) -> datetime:
    """The next ``at`` of ``zone`` at or after ``after`` (a wall time that
    exists every day there), in UTC: worked out here, not by the worker's code."""
    day: date = after.astimezone(zone).date() - timedelta(days=1)
    while True:
        instant = datetime.combine(day, at, tzinfo=zone).astimezone(UTC)
        if instant >= after:
            return instant
        day += timedelta(days=1)


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def cells(body: str, identifier: str) -> dict[str, str]:
    """The text of each cell (by its class) of the item's row in #cron-items."""
    row = re.search(rf'<tr data-item="{re.escape(identifier)}">(.*?)</tr>', body, re.S)
    assert row, body
    found = {}
    for name, cell in re.findall(
        r'<td class="[^"]*?cron-(\w+)[^"]*">(.*?)</td>', row.group(1), re.S
    ):
        text = html.unescape(re.sub(r"<[^>]+>", " ", cell.replace("<wbr>", "")))
        found[name] = " ".join(text.split())
    return found


def post(url: str, fields: dict[str, str], cookie: str = COOKIE) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **fields}).encode()
    return http(url, data=body, headers={"Cookie": cookie})


def test_each_item_with_its_schedule_zone_and_runs(crontab_db: str, url: str) -> None:
    page = http(url + "/crontab")
    assert page.status == 200
    read_at = now(crontab_db)
    order = re.findall(r'<tr data-item="([^"]+)">', page.body)
    assert order == ["send_weekly_email", "nightly_tokyo", "morning_digest", "never_runs"]

    weekly = cells(page.body, "send_weekly_email")
    assert weekly["schedule"] == "30 4 * * 1"
    assert weekly["zone"] == "America/New_York (default)"
    assert "?fill=2d&max=10&priority=3" in weekly["task"]
    assert '{"onboarding": false}' in weekly["task"]
    assert weekly["last"].endswith("(2d 00h ago)")

    tokyo = cells(page.body, "nightly_tokyo")
    assert tokyo["schedule"] == "30 2 * * *"  # as written, its spaces made one
    assert tokyo["zone"] == "Asia/Tokyo"
    assert tokyo["last"].startswith("never (known since")
    # The next 02:30 in Tokyo (no daylight saving there), not the next 02:30 UTC.
    expected = next_daily(time(2, 30), ZoneInfo("Asia/Tokyo"), read_at)
    assert tokyo["next"].startswith(
        f"{stamp(expected)} = {expected.astimezone(ZoneInfo('Asia/Tokyo')):%Y-%m-%d %H:%M} JST"
    )

    # No ?tz=: in the workers' --cron-timezone (here New York), not in UTC.
    morning = cells(page.body, "morning_digest")
    expected = next_daily(time(9, 0), ZoneInfo("America/New_York"), read_at)
    assert morning["next"].startswith(stamp(expected))
    assert morning["last"] == "never: no worker has run this item yet"
    assert cells(page.body, "never_runs")["next"] == "never (no date matches)"

    # Known to the workers but not in the crontab: listed apart, as text.
    others = re.search(r'<table class="grid" id="crontab-table">(.*?)</table>', page.body, re.S)
    assert others and "&lt;i&gt;removed&lt;/i&gt;" in others.group(1)
    assert "send_weekly_email" not in others.group(1)
    assert 'id="cron-default-zone">America/New_York<' in page.body


def test_a_zone_with_a_plus_sign_is_taken_as_written(crontab_db: str) -> None:
    """``tz=Etc/GMT+5`` (five hours behind UTC): a query string's ``+`` would
    be a space, but no zone name has one; ``%2B`` still works too."""
    crontab = (
        "0 12 * * * noon ?id=noon_plus&tz=Etc/GMT+5\n"
        "0 12 * * * noon ?id=noon_escaped&tz=Etc/GMT%2B5\n"
        "0 12 * * * noon ?id=noon_minus&tz=Etc/GMT-14\n"
    )
    app = create_app(crontab_db, csrf_secret=SECRET, crontab=crontab)
    with serve_app(app) as base:
        page = http(base + "/crontab")
    assert page.status == 200, page.body[-600:]
    read_at = now(crontab_db)
    for item, zone in [
        ("noon_plus", "Etc/GMT+5"),
        ("noon_escaped", "Etc/GMT+5"),
        ("noon_minus", "Etc/GMT-14"),
    ]:
        shown = cells(page.body, item)
        assert shown["zone"] == zone, (item, shown)
        expected = next_daily(time(12, 0), ZoneInfo(zone), read_at)
        assert shown["next"].startswith(stamp(expected)), (item, shown, expected)
    assert [item.tz for item in parse_crontab(crontab)] == [
        ZoneInfo("Etc/GMT+5"),
        ZoneInfo("Etc/GMT+5"),
        ZoneInfo("Etc/GMT-14"),
    ]


def test_run_now_adds_the_job_as_cron_would(crontab_db: str, url: str) -> None:
    before = known(crontab_db)
    confirm = http(url + "/crontab/run-now?item=nightly_tokyo", headers={"Cookie": COOKIE})
    assert confirm.status == 200
    assert (
        'id="confirm-form"' in confirm.body and 'name="item" value="nightly_tokyo"' in confirm.body
    )
    assert value(crontab_db, "select count(*) from graphile_worker._private_jobs") == 0  # a GET

    done = post(url + "/crontab/run-now", {"item": "nightly_tokyo"})
    assert done.status == 303
    [job] = rows(
        crontab_db,
        "select j.id, t.identifier as task, q.queue_name, j.payload, j.run_at, j.max_attempts, "
        "j.priority from graphile_worker._private_jobs as j "
        "join graphile_worker._private_tasks as t on t.id = j.task_id "
        "left join graphile_worker._private_job_queues as q on q.id = j.job_queue_id",
    )
    assert done.headers["location"] == f"/jobs/{job['id']}"
    assert f"Job {job['id']} will run now" in follow(url, done, COOKIE).body
    assert (job["task"], job["queue_name"]) == ("nightly_report", "reports")
    cron = job["payload"]["_cron"]
    assert cron["backfilled"] is False
    ts = datetime.fromisoformat(cron["ts"].replace("Z", "+00:00"))
    assert abs((ts - job["run_at"]).total_seconds()) < 0.001
    assert cron["local"] == ts.astimezone(ZoneInfo("Asia/Tokyo")).isoformat(timespec="seconds")
    # The schedule is the scheduler's: its last run is not moved.
    assert known(crontab_db) == before

    post(url + "/crontab/run-now", {"item": "send_weekly_email"})
    weekly = rows(
        crontab_db,
        "select payload, max_attempts, priority from graphile_worker._private_jobs "
        "where task_id = (select id from graphile_worker._private_tasks "
        "where identifier = 'send_weekly_email')",
    )
    assert len(weekly) == 1
    payload = dict(weekly[0]["payload"])
    assert payload.pop("_cron").keys() == {"ts", "backfilled", "local"}  # New York, the default
    assert payload == {"onboarding": False}
    assert (weekly[0]["max_attempts"], weekly[0]["priority"]) == (10, 3)


def test_run_now_is_refused_without_its_token_or_for_an_unknown_item(
    crontab_db: str, url: str
) -> None:
    refused = [
        http(url + "/crontab/run-now", data=urlencode({"item": "nightly_tokyo"}).encode()),
        post(url + "/crontab/run-now", {"item": "nightly_tokyo", "csrf_token": "0" * 64}),
        post(url + "/crontab/run-now", {"item": "nightly_tokyo"}, cookie=f"{Csrf.COOKIE}=other"),
    ]
    assert [reply.status for reply in refused] == [403, 403, 403]
    assert "security token" in refused[0].body
    assert post(url + "/crontab/run-now", {"item": "<i>removed</i>"}).status == 404
    assert http(url + "/crontab/run-now?item=nosuch").status == 404
    assert value(crontab_db, "select count(*) from graphile_worker._private_jobs") == 0


def test_read_only_shows_no_run_now_and_refuses_it(crontab_db: str) -> None:
    app = create_app(crontab_db, csrf_secret=SECRET, crontab=CRONTAB, read_only=True)
    with serve_app(app) as base:
        page = http(base + "/crontab")
        assert page.status == 200 and 'data-item="nightly_tokyo"' in page.body
        assert "cron-run-now" not in page.body
        assert http(base + "/crontab/run-now?item=nightly_tokyo").status == 403
        assert post(base + "/crontab/run-now", {"item": "nightly_tokyo"}).status == 403
        # Without --cron-timezone, the lines without ?tz= run in UTC.
        assert cells(page.body, "morning_digest")["zone"] == "UTC (default)"
    assert value(crontab_db, "select count(*) from graphile_worker._private_jobs") == 0


def test_the_command_reads_its_crontab(
    crontab_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--crontab PATH``, else ./crontab if there is one, else the known items
    alone with a note; a bad crontab stops it with one line, as the worker."""
    (tmp_path / "crontab").write_text("15 * * * * hourly_sync ?id=sync&tz=Europe/Paris\n")
    monkeypatch.chdir(tmp_path)  # the command's working directory
    with serve_cli(crontab_db) as base:
        page = http(base + "/crontab").body
        assert cells(page, "sync")["schedule"] == "15 * * * *"
        assert cells(page, "sync")["zone"] == "Europe/Paris"
    other = tmp_path / "other.crontab"
    other.write_text("0 3 * * * backup\n")
    with serve_cli(crontab_db, "--crontab", str(other), "--cron-timezone", "Asia/Tokyo") as base:
        page = http(base + "/crontab").body
        assert cells(page, "backup")["zone"] == "Asia/Tokyo (default)"
        assert 'data-item="sync"' not in page
    (tmp_path / "crontab").unlink()
    with serve_cli(crontab_db) as base:
        page = http(base + "/crontab").body
        assert 'id="crontab-not-given"' in page and 'id="cron-items"' not in page
        assert "send_weekly_email" in page  # the known items, as before

    other.write_text("0 3 * * * backup\n61 * * * * bad\n")
    failed = run_cli("dashboard", "-c", crontab_db, "--crontab", str(other))
    assert failed.returncode == 1, failed.stderr
    assert failed.stderr.strip().splitlines() == [
        f"Error: {other}: crontab line 2: minute value 61 in '61' is out of range 0-59"
    ]
    unknown = run_cli("dashboard", "-c", crontab_db, "--cron-timezone", "Mars/Olympus")
    assert unknown.returncode == 1 and "unknown time zone 'Mars/Olympus'" in unknown.stderr


@pytest.mark.slow
def test_in_a_browser(crontab_db: str, url: str) -> None:
    with chromium() as browser:
        browser.get(url + "/crontab")
        table = wait_for(browser, "#cron-items")
        texts = {
            row.get_attribute("data-item"): [
                cell.text for cell in row.find_elements(By.TAG_NAME, "td")
            ]
            for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")
        }
        assert texts["nightly_tokyo"][2:4] == ["30 2 * * *", "Asia/Tokyo"]
        assert texts["morning_digest"][3] == "America/New_York (default)"
        assert "<i>removed</i>" in browser.find_element(By.ID, "crontab-table").text
        click(browser, "tr[data-item='nightly_tokyo'] .cron-run-now")
        payload = json.loads(wait_for(browser, "#cron-payload").text)
        assert payload["_cron"]["backfilled"] is False
        click(browser, "#confirm-button")
        notice = wait_for(browser, "#notice.notice-done")
        job_id = value(crontab_db, "select max(id) from graphile_worker._private_jobs")
        assert f"Job {job_id} will run now" in notice.text
        assert browser.current_url == f"{url}/jobs/{job_id}"
        assert browser.find_element(By.ID, "job-task").text == "nightly_report"
        assert console_errors(browser) == []
