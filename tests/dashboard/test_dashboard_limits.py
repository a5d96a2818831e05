"""Limits in the dashboard, over HTTP: the overview lists the limits with how
much of each is in use (slots running, the window's starts, partition values
seen) and flags the limited queues and tasks; its form sets or changes a
limit (through WorkerUtils.set_limit, checked as the utilities check), a
button removes one; the outcome is the one-time banner, and bad input is
refused with one line naming the field, writing nothing; read-only hides and
refuses both."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import COOKIE, SECRET, TOKEN, Reply, follow, http, serve_app
from dashboard_notices import assert_done, assert_refused, banner
from dbhelpers import rows, value

from worker_cli.dashboard import create_app
from worker_cli.dashboard import page_data as reads

pytestmark = pytest.mark.db

LIMITS = "graphile_worker._private_py_limits"
#: Locks what the limits let start, as a worker's fetch does (pool 'p').
FETCH = (
    "select id from graphile_worker.py_fetch_limited_jobs("
    "array(select id from graphile_worker._private_tasks), null, 10, 'p')"
)


def post(url: str, fields: dict[str, str], *, token: str | None = TOKEN) -> Reply:
    body = urlencode({**({"csrf_token": token} if token else {}), **fields}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def after(base: str, reply: Reply) -> Reply:
    """The page an action's redirect leads to (the overview), as the browser gets it."""
    assert reply.status == 303, reply.body[-600:]
    assert reply.headers["location"] == "/", reply.headers["location"]
    return follow(base, reply, COOKIE)


def limits(db: str) -> list[tuple[Any, ...]]:
    return [
        (r["kind"], r["name"], r["max_running"], r["max_starts"], r["period"], r["partition_by"])
        for r in rows(
            db,
            f"select kind, name, max_running, max_starts, period, partition_by from {LIMITS} "
            "order by kind, name",
        )
    ]


def overview(url: str) -> str:
    page = http(url + "/", headers={"Cookie": COOKIE})
    assert page.status == 200, page.body[-600:]
    return page.body


def text(fragment: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment)).strip()


def limit_row(page: str, kind: str, name: str) -> dict[str, str] | None:
    """The cells of the limits table's row of ``kind:name``, as text, by
    column (None: no such row)."""
    found = re.search(rf'<tr data-limit="{kind}:{re.escape(name)}">(.*?)</tr>', page, re.DOTALL)
    if found is None:
        return None
    cells = [text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", found[1], re.DOTALL)]
    return dict(zip(("limited", "running", "starts", "partitions"), cells, strict=False))


def flagged(page: str, table: str) -> list[str]:
    """The names a table of the overview (tasks-table, queues-table) flags as limited."""
    [body] = re.findall(rf'<table class="grid" id="{table}">(.*?)</table>', page, re.DOTALL)
    return re.findall(
        r'>([^<>]+)</a>(?: <span class="badge badge-paused"[^>]*>paused</span>)?'
        r' <span class="badge badge-limited"',
        body,
    )


def test_set_change_and_remove_a_limit_from_the_form(db: str, url: str) -> None:
    rows(db, "select graphile_worker.add_job('charge', '{\"account_id\": 1}')")
    rows(db, "select graphile_worker.add_job('send_email', queue_name => 'mail')")
    page = overview(url)
    assert 'id="no-limits"' in page and 'id="limit-form"' in page
    assert flagged(page, "tasks-table") == [] and flagged(page, "queues-table") == []

    fields = {
        "kind": "task",
        "name": "charge",
        "max_running": "3",
        "max_starts": "50",
        "per": "1s",
        "partition_by": "account_id",
    }
    shown = after(url, post(url + "/limits", fields))
    assert_done(
        shown,
        "Limited task charge: at most 3 running, at most 50 starts per 1s, per value of "
        "account_id. Every Python worker keeps to it from its next fetch.",
    )
    assert limits(db) == [("task", "charge", 3, 50, timedelta(seconds=1), "account_id")]
    listed = limit_row(shown.body, "task", "charge")
    assert listed is not None, shown.body[-2000:]
    assert listed["running"] == "busiest value: 0 / 3 running (0 in all)", listed
    assert listed["starts"] == "busiest value: 0 / 50 starts in the last 1s (0 in all)", listed
    assert listed["partitions"] == "per account_id : 0 values seen", listed
    assert flagged(shown.body, "tasks-table") == ["charge"]
    assert flagged(shown.body, "queues-table") == []

    # Changed: the same name again replaces it (no rate now, no partitions).
    fields = {"kind": "task", "name": "charge", "max_running": "5", "per": "", "max_starts": ""}
    shown = after(url, post(url + "/limits", fields))
    assert_done(shown, "Limited task charge: at most 5 running. Every Python worker")
    assert limits(db) == [("task", "charge", 5, None, None, None)]
    listed = limit_row(shown.body, "task", "charge")
    assert listed is not None
    assert listed["running"] == "0 / 5 running", listed
    assert listed["starts"] == "no rate limit" and listed["partitions"] == "one for all", listed

    fields = {"kind": "queue", "name": " mail ", "max_starts": "10", "per": "10m"}
    shown = after(url, post(url + "/limits", fields))
    assert_done(shown, "Limited queue mail: at most 10 starts per 10m.")
    listed = limit_row(shown.body, "queue", "mail")
    assert listed is not None
    assert listed["running"] == "no cap on running", listed
    assert listed["starts"] == "0 / 10 starts in the last 10m", listed
    assert flagged(shown.body, "queues-table") == ["mail"]

    shown = after(url, post(url + "/limits/remove", {"kind": "task", "name": "charge"}))
    assert_done(shown, "Removed the limit of task charge: its jobs start without it.")
    assert limits(db) == [("queue", "mail", None, 10, timedelta(minutes=10), None)]
    assert limit_row(shown.body, "task", "charge") is None
    assert flagged(shown.body, "tasks-table") == []
    again = after(url, post(url + "/limits/remove", {"kind": "task", "name": "charge"}))
    assert_refused(again, "Task charge had no limit")
    shown = after(url, post(url + "/limits/remove", {"kind": "queue", "name": "mail"}))
    assert_done(shown, "Removed the limit of queue mail")
    assert limits(db) == [] and 'id="no-limits"' in shown.body


def test_the_use_is_shown_once_jobs_are_locked(db: str, url: str) -> None:
    """Slots in use count the jobs still locked; the window's starts stay
    counted after the jobs end; a partitioned limit shows its busiest value
    and the total."""
    rows(db, "select graphile_worker.add_job('charge') from generate_series(1, 5)")
    rows(
        db,
        "select graphile_worker.add_job('bill', json_build_object('account_id', a)) "
        "from unnest(array['a', 'a', 'a', 'b']) as a",
    )
    rows(db, "select graphile_worker.py_set_limit('task', 'charge', 3, 50, '1 hour')")
    rows(db, "select graphile_worker.py_set_limit('task', 'bill', 2, null, null, 'account_id')")
    assert len(rows(db, FETCH)) == 6  # 3 of charge, 2 of account a, 1 of b
    # A start from before the window (2 hours ago, of a 1-hour window) does not count.
    rows(
        db,
        "update graphile_worker._private_py_limit_state set "
        "starts = array[now() - interval '2 hours'] || starts, "
        "started = array[0::bigint] || started where name = 'charge'",
    )

    page = overview(url)
    charge = limit_row(page, "task", "charge")
    assert charge is not None, page[-2000:]
    assert charge["limited"] == "task charge full", charge
    assert charge["running"] == "3 / 3 running", charge
    assert charge["starts"] == "3 / 50 starts in the last 1h", charge
    bill = limit_row(page, "task", "bill")
    assert bill is not None
    assert bill["limited"] == "task bill full", bill
    assert bill["running"] == "busiest value: 2 / 2 running (3 in all)", bill
    assert bill["partitions"] == "per account_id : 2 values seen", bill
    assert 'title="Limited: at most 3 running (3 now), at most 50 starts per 1h' in page

    # One of charge done (its row deleted, as a worker completes a job), one
    # given back (unlocked), and one of account a done: their slots are free,
    # their starts stay.
    rows(
        db,
        "delete from graphile_worker._private_jobs where id = (select min(id) from "
        "graphile_worker.jobs where task_identifier = 'charge' and locked_at is not null)",
    )
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = null, locked_by = null "
        "where id = (select min(id) from graphile_worker.jobs "
        "where task_identifier = 'charge' and locked_at is not null)",
    )
    rows(
        db,
        "delete from graphile_worker._private_jobs where id in (select id from "
        "graphile_worker._private_jobs where payload->>'account_id' = 'a' "
        "and locked_at is not null limit 1)",
    )
    page = overview(url)
    charge = limit_row(page, "task", "charge")
    assert charge is not None and charge["limited"] == "task charge", charge
    assert charge["running"] == "1 / 3 running", charge
    assert charge["starts"] == "3 / 50 starts in the last 1h", charge
    bill = limit_row(page, "task", "bill")
    assert bill is not None and bill["running"] == "busiest value: 1 / 2 running (2 in all)", bill


def test_the_panel_reads_a_bounded_number_of_limits(
    db: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "LIMITS_SHOWN", 2)
    asked: list[dict[str, Any]] = []
    rows_of = reads.Reader.rows

    async def spy(self: reads.Reader, statement: Any, **params: Any) -> list[dict[str, Any]]:
        if statement is reads.limits_sql.LIMIT_USAGE:
            asked.append(params)
        return await rows_of(self, statement, **params)

    monkeypatch.setattr(reads.Reader, "rows", spy)
    for name in ("a", "b", "c"):
        rows(db, "select graphile_worker.py_set_limit('task', %s, 1)", (name,))
    page = overview(url)
    # One more than shown (to say there are more), 1,001 partition values of each.
    assert asked == [{"limit": 3, "partitions": reads.PARTITIONS_READ + 1}]
    assert [m for m in re.findall(r'data-limit="task:(\w)"', page)] == ["a", "b"]
    assert "The first 2 limits." in page


LONG = "q" * 129

BAD: list[tuple[dict[str, str], str]] = [
    ({"name": "charge", "max_running": "1"}, "Kind: choose queue or task, not ''"),
    ({"kind": "topic", "name": "charge", "max_running": "1"}, "Kind: choose queue or task"),
    ({"kind": "task", "name": "", "max_running": "1"}, "Name: give a queue's name or a task"),
    ({"kind": "task", "name": "  ", "max_running": "1"}, "Name: give a queue's name"),
    ({"kind": "task", "name": "*", "max_running": "1"}, "Name: a limit names one task or queue"),
    ({"kind": "queue", "name": LONG, "max_running": "1"}, "Name: 'qqqq"),
    ({"kind": "task", "name": "ch\x00", "max_running": "1"}, "Name: 'ch\\x00' contains a NUL"),
    ({"kind": "task", "name": "charge"}, "Max running: give a max running, a max starts with"),
    ({"kind": "task", "name": "charge", "max_running": "x"}, "Max running: not a whole number"),
    ({"kind": "task", "name": "charge", "max_running": "0"}, "Max running: must be between 1"),
    ({"kind": "task", "name": "charge", "max_running": "10001"}, "and 10000, not 10001"),
    ({"kind": "task", "name": "charge", "max_running": "2.5"}, "Max running: not a whole"),
    ({"kind": "task", "name": "charge", "max_starts": "-5", "per": "1s"}, "Max starts: must be"),
    ({"kind": "task", "name": "charge", "max_starts": "50"}, "Per: give the window of the 50"),
    ({"kind": "task", "name": "charge", "per": "1s"}, "Max starts: give how many jobs may start"),
    (
        {"kind": "task", "name": "charge", "max_starts": "5", "per": "soon"},
        "Per: 'soon' is not a length such as 90s, 10m, 2h or 1d",
    ),
    (
        {"kind": "task", "name": "charge", "max_starts": "5", "per": "0s"},
        "Per: '0s': a window lasts above 0 and at most a day",
    ),
    ({"kind": "task", "name": "charge", "max_starts": "5", "per": "25h"}, "Per: '25h': a window"),
    (
        {"kind": "task", "name": "charge", "max_running": "1", "partition_by": LONG},
        "Partition field: 'qqqq",
    ),
    (
        {"kind": "task", "name": "charge", "max_running": "1", "partition_by": "a\x00"},
        "Partition field: 'a\\x00' contains a NUL",
    ),
]


@pytest.mark.parametrize(("fields", "says"), BAD, ids=[says for _, says in BAD])
def test_bad_input_is_refused_with_one_line_naming_the_field(
    db: str, url: str, fields: dict[str, str], says: str
) -> None:
    rows(db, "select graphile_worker.py_set_limit('task', 'charge', 7)")
    before = limits(db)
    page = after(url, post(url + "/limits", fields))
    assert page.status == 200
    assert_refused(page, says)
    shown = banner(page)
    assert shown is not None
    line = shown[2]
    assert "\n" not in line and line.endswith(". Nothing was changed."), line
    assert len(line) < 300, line
    assert "Traceback" not in page.body
    assert limits(db) == before == [("task", "charge", 7, None, None, None)]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "tasks", "name": "charge"}, "Kind: choose queue or task"),
        ({"kind": "task", "name": ""}, "Name: give"),
        ({"kind": "task", "name": "x\x00"}, "NUL character"),
    ],
)
def test_a_remove_of_bad_values_is_refused(
    db: str, url: str, fields: dict[str, str], says: str
) -> None:
    rows(db, "select graphile_worker.py_set_limit('task', 'charge', 1)")
    assert_refused(after(url, post(url + "/limits/remove", fields)), says)
    assert len(limits(db)) == 1


def test_a_post_without_its_token_or_from_elsewhere_writes_nothing(db: str, url: str) -> None:
    rows(db, "select graphile_worker.py_set_limit('task', 'kept', 2)")
    fields = {"kind": "queue", "name": "mail", "max_running": "1"}
    for reply in (
        post(url + "/limits", fields, token=None),
        post(url + "/limits", fields, token="0" * 64),
        post(url + "/limits/remove", {"kind": "task", "name": "kept"}, token=None),
        post(url + "/limits/remove", {"kind": "task", "name": "kept"}, token="0" * 64),
    ):
        assert reply.status == 403 and "security token" in reply.body
    for path, form in (("/limits", fields), ("/limits/remove", {"kind": "task", "name": "kept"})):
        cross = http(
            url + path,
            data=urlencode({"csrf_token": TOKEN, **form}).encode(),
            headers={"Cookie": COOKIE, "Origin": "http://evil.example"},
        )
        assert cross.status == 403 and "another site" in cross.body
    assert http(url + "/limits").status == 405  # a link cannot set a limit
    assert http(url + "/limits/remove").status == 405
    assert limits(db) == [("task", "kept", 2, None, None, None)]


def test_read_only_shows_the_limits_and_refuses_to_change_them(db: str) -> None:
    rows(db, "select graphile_worker.py_set_limit('queue', 'mail', 4)")
    with serve_app(create_app(db, read_only=True, csrf_secret=SECRET)) as url:
        page = overview(url)
        listed = limit_row(page, "queue", "mail")
        assert listed is not None and listed["running"] == "0 / 4 running", listed
        assert 'id="limit-form"' not in page and "/limits/remove" not in page
        assert "limit-change" not in page
        set_one = post(url + "/limits", {"kind": "task", "name": "charge", "max_running": "1"})
        removed = post(url + "/limits/remove", {"kind": "queue", "name": "mail"})
        for reply in (set_one, removed):
            assert reply.status == 403 and "read-only" in reply.body
    assert limits(db) == [("queue", "mail", 4, None, None, None)]
    assert value(db, "select count(*) from graphile_worker._private_py_limit_state") == 0
