"""The queue in Django's admin (worker_cli.contrib.django.admin), through
Django's test client as a staff user: the jobs, finished jobs and schedules
pages, each action's permission and its effect in the database (a job a
worker holds left alone and reported), text shown escaped, the bounded
queries of a list of many jobs, and a project without the admin."""

from __future__ import annotations

import datetime as dt
import html
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import manage, staff_client
from dbhelpers import rows, value

from worker_cli import make_sync_worker_utils

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"
HISTORY = "graphile_worker._private_py_job_history"
LIST = "/admin/graphile_worker/job/"
FINISHED = "/admin/graphile_worker/finishedjob/"
SCHEDULES = "/admin/graphile_worker/schedule/"
ACTIONS = ("retry_jobs", "cancel_jobs", "reschedule_jobs", "fail_jobs", "delete_jobs")
PERMISSION = {
    "retry_jobs": "retry_job",
    "cancel_jobs": "cancel_job",
    "reschedule_jobs": "reschedule_job",
    "fail_jobs": "fail_job",
    "delete_jobs": "delete_job",
}
SCRIPT = "<script>alert('x')</script>"
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "django.md"


def add(url: str, task: str = "send_email", payload: Any = None, **options: Any) -> int:
    with make_sync_worker_utils(url) as utils:
        return utils.add_job(task, payload if payload is not None else {}, **options).id


def lock(url: str, job_id: int) -> None:
    """The job as a worker holds it (running)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"update {JOBS} set locked_at = now(), locked_by = 'worker-1' where id = %s", [job_id]
        )


def fail_for_good(url: str, job_id: int, error: str = "boom") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"update {JOBS} set attempts = max_attempts, last_error = %s where id = %s",
            [error, job_id],
        )


def job(url: str, job_id: int) -> dict[str, Any] | None:
    found = rows(url, f"select * from {JOBS} where id = %s", [job_id])
    return found[0] if found else None


def said(response: Any) -> list[str]:
    """The messages the page shows (Django's message list), as text."""
    found = re.findall(r'<li class="(\w+)">(.*?)</li>', _messages(response), re.S)
    return [f"{level}: {html.unescape(text.strip())}" for level, text in found]


def _messages(response: Any) -> str:
    page = response.content.decode()
    start = page.find('<ul class="messagelist">')
    return "" if start < 0 else page[start : page.index("</ul>", start)]


def offered(response: Any) -> list[str]:
    """The actions the list's menu offers."""
    page = response.content.decode()
    menu = re.search(r'<select name="action".*?</select>', page, re.S)
    return re.findall(r'<option value="(\w+)"', menu.group(0)) if menu else []


def act(client: Any, action: str, ids: list[int], **extra: Any) -> Any:
    """The list's action on ``ids``, as the Run button posts it (answered as is)."""
    return client.post(
        LIST, {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    )


def confirm(client: Any, page: Any, **fields: str) -> Any:
    """Post the confirmation page's form as its button does, with ``fields``
    filled in; the page it leads to (redirects followed)."""
    text = page.content.decode()
    assert 'id="graphile-worker-confirm"' in text, text[-2000:]
    form = re.search(r'<form method="post" action="([^"]*)"', text)
    assert form
    data: dict[str, Any] = {}
    for name, value_ in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', text):
        if name == "csrfmiddlewaretoken":
            continue
        data.setdefault(name, []).append(html.unescape(value_))
    data.update(fields)
    return client.post(html.unescape(form.group(1)), data, follow=True)


def cells(response: Any, column: str) -> list[str]:
    """The text of a list's column (its ``field-NAME`` cells), row by row."""
    found = re.findall(
        rf'class="field-{column}(?: [^"]*)?">(.*?)</t[dh]>', response.content.decode()
    )
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in found]


# --- permissions ------------------------------------------------------------------


def test_pages_need_the_view_permission_and_offer_nothing_to_add_or_edit(queue: str) -> None:
    job_id = add(queue)
    nobody = staff_client()
    assert nobody.get(LIST).status_code == 403
    assert nobody.get(f"{LIST}{job_id}/change/").status_code == 403
    viewer = staff_client("view_job")
    page = viewer.get(LIST)
    assert page.status_code == 200
    assert offered(page) == []  # no action without its permission
    assert viewer.get(f"{LIST}add/").status_code == 403
    assert viewer.get(f"{LIST}{job_id}/delete/").status_code == 403
    detail = viewer.get(f"{LIST}{job_id}/change/")
    assert detail.status_code == 200 and 'name="_save"' not in detail.content.decode()
    # A change posted anyway changes nothing.
    assert viewer.post(f"{LIST}{job_id}/change/", {"priority": "5"}).status_code == 403
    assert job(queue, job_id)["priority"] == 0  # type: ignore[index]
    assert staff_client("view_finishedjob").get(FINISHED).status_code == 200
    assert staff_client("view_schedule").get(SCHEDULES).status_code == 200
    assert staff_client("view_schedule").get(LIST).status_code == 403


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_needs_its_own_permission(queue: str, action: str) -> None:
    failed = add(queue)
    fail_for_good(queue, failed)
    client = staff_client("view_job", PERMISSION[action])
    assert offered(client.get(LIST)) == [action]
    # The others, posted anyway, are refused and change nothing.
    before = job(queue, failed)
    for other in ACTIONS:
        if other != action:
            done = act(client, other, [failed], post="yes", run_at="2030-01-01T10:00")
            assert done.status_code == 302
            assert job(queue, failed) == before


def test_the_guides_example_grants_the_permissions_it_names(queue: str) -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index("\n## The admin\n") :]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    User.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    exec(compile(block, "docs/guides/django.md", "exec"), {})
    client = Client()
    client.force_login(User.objects.get(username="ops"))
    assert offered(client.get(LIST)) == ["retry_jobs", "cancel_jobs"]


# --- the list ---------------------------------------------------------------------


def test_the_list_shows_each_state_in_the_words_every_command_prints(queue: str) -> None:
    waiting = add(queue, "send_email", job_key="the-key")
    scheduled = add(queue, "send_email", run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    retrying = add(queue, "send_email", queue_name="mail")
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            f"update {JOBS} set attempts = 1, last_error = 'first line\nsecond' where id = %s",
            [retrying],
        )
    failed = add(queue, "charge_card")
    fail_for_good(queue, failed, "card declined")
    running = add(queue, "charge_card")
    lock(queue, running)
    paused = add(queue, "resize_image")
    with make_sync_worker_utils(queue) as utils:
        utils.pause(task="resize_image")
    client = staff_client("view_job")
    page = client.get(LIST)
    ids = [int(cell) for cell in cells(page, "id")]
    assert ids == [paused, running, failed, retrying, scheduled, waiting]  # newest first
    assert cells(page, "state_shown") == [
        "paused (task resize_image)",
        "running",
        "failed",
        "retrying",
        "scheduled",
        "waiting",
    ]
    assert cells(page, "error_shown")[2:4] == ["card declined", "first line"]
    assert cells(page, "job_queue")[3] == "mail"
    assert "6 jobs" in page.content.decode()
    # Filters: state (an earlier version's word too), task, queue; in the window.
    assert cells(client.get(LIST, {"state": "failed"}), "id") == [str(failed)]
    assert cells(client.get(LIST, {"state": "permanently_failed"}), "id") == [str(failed)]
    assert cells(client.get(LIST, {"task": "charge_card"}), "id") == [str(running), str(failed)]
    assert cells(client.get(LIST, {"queue": "mail"}), "id") == [str(retrying)]
    # Searches: an id, a key.
    assert cells(client.get(LIST, {"q": str(scheduled)}), "id") == [str(scheduled)]
    assert cells(client.get(LIST, {"q": "the-key"}), "id") == [str(waiting)]
    # Anything else is refused, never a scan: a column's lookup, an unknown state.
    assert client.get(LIST, {"last_error__contains": "card"}).status_code == 400
    assert client.get(LIST, {"state": "nope"}).status_code == 302  # ?e=1


def test_a_jobs_page_shows_its_payload_and_errors_escaped(queue: str) -> None:
    job_id = add(queue, "send_email", {"to": "a@example.com", "html": SCRIPT, "n": [1, 2]})
    fail_for_good(queue, job_id, f"bad input: {SCRIPT}")
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            "insert into graphile_worker._private_py_job_errors "
            "(job_id, task_identifier, attempt, failed_at, error, retried, traceback) "
            "values (%s, 'send_email', 1, now(), 'ValueError: <b>bold</b>', false, "
            "'Traceback (most recent call last):\n  ...\nValueError: <b>bold</b>')",
            [job_id],
        )
    page = staff_client("view_job").get(f"{LIST}{job_id}/change/").content.decode()
    assert "<script>alert" not in page and "<b>bold</b>" not in page
    assert "&quot;html&quot;: &quot;&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;" in page
    assert "bad input: &lt;script&gt;" in page
    assert "ValueError: &lt;b&gt;bold&lt;/b&gt;" in page
    assert "attempt 1 failed" in page
    # The payload is indented JSON, keys in their order.
    shown = html.unescape(
        re.search(r'<pre class="graphile-worker-json">(.*?)</pre>', page, re.S)[1]
    )
    assert shown.startswith('{\n  "to": "a@example.com",\n  "html": ')


def test_json_python_cannot_read_breaks_no_page(queue: str) -> None:
    """Payloads and results PostgreSQL stores but Python cannot parse
    (written by SQL): shown as stored, and said so; the rest works."""
    deep, digits = "[" * 5000 + "]" * 5000, "1" * 5000
    job_id = add(queue)
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(f"update {JOBS} set payload = %s::json where id = %s", [deep, job_id])
        conn.execute(
            f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
            "max_attempts, revision, result, created_at, run_at, finished_at, expires_at) "
            "values (7, 'succeeded', 'report', 0, 1, 1, 0, %s::json, now(), now(), now(), "
            "now() + interval '1 day')",
            [digits],
        )
    with make_sync_worker_utils(queue) as utils:
        utils.add_schedule("odd", "0 3 * * *", "report", {"n": 1})
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            "update graphile_worker._private_py_schedules set payload = %s::json",
            [f'{{"n": {digits}}}'],
        )
    client = staff_client(superuser=True)
    assert cells(client.get(LIST), "id") == [str(job_id)]
    page = client.get(f"{LIST}{job_id}/change/").content.decode()
    assert "Shown as stored: Python cannot read it as JSON (RecursionError)." in page
    assert "[[[[" in page
    done = confirm(client, act(client, "reschedule_jobs", [job_id]), run_at="2031-01-01T00:00")
    assert said(done) == [f"success: Rescheduled 1 job: {job_id}"]
    assert cells(client.get(FINISHED), "job_id") == ["7"]
    page = client.get(f"{FINISHED}7/change/").content.decode()
    assert "Shown as stored: Python cannot read it as JSON (ValueError)." in page
    assert cells(client.get(SCHEDULES), "identifier") == ["odd"]
    page = client.get(f"{SCHEDULES}odd/change/").content.decode()
    assert "Shown as stored: Python cannot read it as JSON (ValueError)." in page
    done = client.post(
        SCHEDULES, {"action": "pause_schedules", "_selected_action": ["odd"], "index": "0"}
    )
    assert said(client.get(done["Location"])) == ["success: Paused 1 schedule: odd"]


def test_a_run_at_python_cannot_hold_breaks_no_page(queue: str) -> None:
    """``run_at`` of ``infinity`` (a parked job), ``-infinity``, a year BC or
    past 9999 (SQL's add_job takes them all), which a Python datetime cannot
    hold: the lists and the jobs' pages show it as stored, the state comes
    from the stored value, and the actions work on it."""
    parked, early, bc, plain = add(queue), add(queue), add(queue), add(queue)
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute("set timezone = 'UTC'")
        conn.execute(f"update {JOBS} set run_at = 'infinity' where id = %s", [parked])
        conn.execute(f"update {JOBS} set run_at = '-infinity' where id = %s", [early])
        conn.execute(f"update {JOBS} set run_at = '0044-03-15 BC' where id = %s", [bc])
        conn.execute(
            f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
            "max_attempts, revision, created_at, run_at, finished_at, expires_at) "
            "values (7, 'succeeded', 'report', 0, 1, 1, 0, now(), '-infinity', now(), "
            "now() + interval '1 day')"
        )
    client = staff_client(superuser=True)
    listed = client.get(LIST)
    assert listed.status_code == 200
    assert cells(listed, "id") == [str(plain), str(bc), str(early), str(parked)]
    shown = cells(listed, "run_at_shown")
    assert shown[1:] == ["0044-03-15 00:00:00+00 BC", "-infinity", "infinity"], shown
    assert str(dt.datetime.now(dt.UTC).year) in shown[0]  # a date, as Django shows one
    assert cells(listed, "state_shown")[1:] == ["waiting", "waiting", "scheduled"]
    for job_id, stored in ((parked, "infinity"), (early, "-infinity")):
        page = client.get(f"{LIST}{job_id}/change/")
        assert page.status_code == 200 and f">{stored}<" in page.content.decode()
    assert cells(client.get(FINISHED), "job_id") == ["7"]
    page = client.get(f"{FINISHED}7/change/")
    assert page.status_code == 200 and ">-infinity<" in page.content.decode()
    done = act(client, "retry_jobs", [parked])
    assert said(client.get(done["Location"])) == [f"success: Retried 1 job: {parked}"]
    assert value(queue, f"select run_at <= now() from {JOBS} where id = %s", [parked]) is True


# --- the actions ------------------------------------------------------------------


def test_retry_runs_jobs_now_and_leaves_a_locked_one_alone(queue: str) -> None:
    failed = add(queue, run_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    fail_for_good(queue, failed)
    running = add(queue)
    lock(queue, running)
    client = staff_client("view_job", "retry_job")
    done = act(client, "retry_jobs", [failed, running])
    assert done.status_code == 302
    page = client.get(done["Location"])
    assert said(page) == [
        f"success: Retried 1 job: {failed}",
        f"warning: Skipped 1 job locked by a worker (left alone): {running}",
    ]
    retried = job(queue, failed)
    assert retried is not None and retried["attempts"] == 0
    assert retried["run_at"] <= dt.datetime.now(dt.UTC)
    held = job(queue, running)
    assert held is not None and held["locked_by"] == "worker-1" and held["attempts"] == 0
    # The retry is marked as the command line's is, by the Django admin.
    marks = rows(
        queue,
        "select retried_by from graphile_worker._private_py_job_errors where job_id = %s",
        [failed],
    )
    assert marks == [{"retried_by": "django-admin"}]


def test_cancel_asks_first_then_cancels_and_tells_a_running_job_to_stop(queue: str) -> None:
    waiting = add(queue)
    running = add(queue)
    lock(queue, running)
    client = staff_client("view_job", "cancel_job")
    page = act(client, "cancel_jobs", [waiting, running])
    assert page.status_code == 200  # the confirmation: nothing done yet
    text = page.content.decode()
    assert "1 of them is running: they are told to stop" in text
    assert job(queue, waiting) is not None
    done = confirm(client, page, reason="not needed <any more>")
    assert said(done) == [
        f"success: Cancelled 1 job: {waiting}",
        f"info: Told 1 running job to stop (recorded as cancelled when it ends): {running}",
    ]
    assert job(queue, waiting) is None
    [record] = rows(
        queue, f"select state, cancel_reason from {HISTORY} where job_id = %s", [waiting]
    )
    assert record == {"state": "cancelled", "cancel_reason": "not needed <any more>"}
    assert job(queue, running) is not None  # its worker ends it


def test_reschedule_asks_for_a_run_at(queue: str) -> None:
    job_id = add(queue)
    client = staff_client("view_job", "reschedule_job")
    page = act(client, "reschedule_jobs", [job_id])
    assert 'type="datetime-local"' in page.content.decode()
    again = confirm(client, page, run_at="not a time")
    assert "Enter a valid date/time." in again.content.decode()
    done = confirm(client, again, run_at="2031-03-04T05:06")
    assert said(done) == [f"success: Rescheduled 1 job: {job_id}"]
    moved = job(queue, job_id)
    assert moved is not None and moved["run_at"] == dt.datetime(2031, 3, 4, 5, 6, tzinfo=dt.UTC)


def test_fail_keeps_the_real_error_and_skips_a_locked_job(queue: str) -> None:
    job_id = add(queue)
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            f"update {JOBS} set attempts = 1, last_error = 'timeout' where id = %s", [job_id]
        )
    running = add(queue)
    lock(queue, running)
    client = staff_client("view_job", "fail_job")
    done = confirm(client, act(client, "fail_jobs", [job_id, running]))
    assert said(done) == [
        f"success: Permanently failed 1 job: {job_id}",
        f"warning: Skipped 1 job locked by a worker (left alone): {running}",
    ]
    failed = job(queue, job_id)
    assert failed is not None and failed["attempts"] == failed["max_attempts"]
    assert failed["last_error"] == "permanently failed from the Django admin (was: timeout)"
    held = job(queue, running)
    assert held is not None and held["attempts"] == 0


def test_delete_removes_jobs_recorded_as_removed_by_the_django_admin(queue: str) -> None:
    job_id = add(queue)
    running = add(queue)
    lock(queue, running)
    client = staff_client("view_job", "delete_job")
    done = confirm(client, act(client, "delete_jobs", [job_id, running]))
    assert said(done) == [
        f"success: Deleted 1 job: {job_id}",
        f"warning: Skipped 1 job locked by a worker (left alone): {running}",
    ]
    assert job(queue, job_id) is None and job(queue, running) is not None
    [record] = rows(queue, f"select state, removed_by from {HISTORY} where job_id = %s", [job_id])
    assert record == {"state": "removed", "removed_by": "django-admin"}
    # Its page is the finished job's now.
    page = staff_client("view_finishedjob").get(f"{FINISHED}{job_id}/change/")
    assert page.status_code == 200 and "django-admin" in page.content.decode()


def test_actions_on_a_jobs_own_page_come_back_to_it(queue: str) -> None:
    job_id = add(queue)
    client = staff_client("view_job", "retry_job", "cancel_job", "view_finishedjob")
    page = f"{LIST}{job_id}/change/"
    shown = client.get(page).content.decode()
    if 'name="CHANGE_FORM-action"' not in shown:
        pytest.skip("Django before 6.1 has no actions on an object's page")
    asked = client.post(
        page, {"CHANGE_FORM-action": "cancel_jobs", "_selected_action": str(job_id), "index": "0"}
    )
    assert asked.status_code == 200
    done = confirm(client, asked)
    assert done.redirect_chain[-1][0] == f"{FINISHED}{job_id}/change/"
    assert said(done) == [f"success: Cancelled 1 job: {job_id}"]


def test_select_all_acts_on_the_filtered_list_up_to_the_highest_id_counted(queue: str) -> None:
    first = [add(queue, "charge_card") for _ in range(3)]
    other = add(queue, "send_email")
    client = staff_client("view_job", "delete_job")
    asked = client.post(
        f"{LIST}?task=charge_card",
        {
            "action": "delete_jobs",
            "_selected_action": [str(first[-1])],
            "select_across": "1",
            "index": "0",
        },
    )
    assert "Delete every job the list's filters match: 3 jobs?" in asked.content.decode()
    late = add(queue, "charge_card")  # after the count: not acted on
    done = confirm(client, asked)
    assert said(done) == [f"success: Deleted 3 jobs: {', '.join(map(str, first))}"]
    assert job(queue, late) is not None and job(queue, other) is not None


def test_an_action_joins_djangos_transaction(queue: str) -> None:
    from django.db import transaction

    from worker_cli.client.admin_batches import Outcome
    from worker_cli.contrib.django.admin_actions import queue_session

    job_id = add(queue)
    outcome = Outcome("remove")
    with pytest.raises(RuntimeError), transaction.atomic():
        with queue_session() as session:
            session.act(outcome, session.action("remove"), [job_id])
        assert value(queue, f"select count(*) from {JOBS} where id = %s", [job_id]) == 1
        raise RuntimeError("rolled back")
    assert outcome.changed == [job_id]
    assert job(queue, job_id) is not None  # the removal was rolled back with Django's


# --- finished jobs and schedules --------------------------------------------------


def test_finished_jobs_are_listed_with_their_result_escaped(queue: str) -> None:
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            f"insert into {HISTORY} (job_id, state, task_identifier, priority, attempts, "
            "max_attempts, revision, result, last_error, created_at, run_at, finished_at, "
            "expires_at) values "
            "(1001, 'succeeded', 'report', 0, 1, 25, 0, %s, 'an earlier attempt', now(), "
            "now(), now(), now() + interval '1 day'), "
            "(1002, 'failed', 'report', 0, 25, 25, 0, null, %s, now(), now(), now(), "
            "now() + interval '1 day')",
            [f'{{"html": "{SCRIPT}"}}', f"crashed: {SCRIPT}"],
        )
    client = staff_client("view_finishedjob")
    page = client.get(FINISHED)
    assert cells(page, "job_id") == ["1002", "1001"]
    assert cells(page, "state") == ["failed", "succeeded"]
    assert cells(page, "outcome_shown") == [f"crashed: {SCRIPT}", "-"]
    assert "<script>" not in page.content.decode()
    assert cells(client.get(FINISHED, {"state": "failed"}), "job_id") == ["1002"]
    detail = client.get(f"{FINISHED}1001/change/").content.decode()
    assert "<script>" not in detail and "&lt;script&gt;" in detail
    assert offered(page) == []


def test_schedules_are_paused_resumed_and_removed_through_the_utilities(queue: str) -> None:
    with make_sync_worker_utils(queue) as utils:
        utils.add_schedule("nightly", "0 3 * * *", "report", {"html": SCRIPT})
        utils.add_schedule("hourly", "0 * * * *", "ping")
    viewer = staff_client("view_schedule")
    page = viewer.get(SCHEDULES)
    assert cells(page, "identifier") == ["hourly", "nightly"] and offered(page) == []
    assert "&lt;script&gt;" in viewer.get(f"{SCHEDULES}nightly/change/").content.decode()
    client = staff_client("view_schedule", "pause_schedule", "resume_schedule")
    assert offered(client.get(SCHEDULES)) == ["pause_schedules", "resume_schedules"]

    def run(action: str, *names: str) -> list[str]:
        done = client.post(
            SCHEDULES, {"action": action, "_selected_action": list(names), "index": "0"}
        )
        return said(client.get(done["Location"]))

    assert run("pause_schedules", "nightly") == ["success: Paused 1 schedule: nightly"]
    paused = rows(queue, "select identifier, paused from graphile_worker._private_py_schedules")
    assert {row["identifier"]: row["paused"] for row in paused} == {
        "nightly": True,
        "hourly": False,
    }
    assert run("resume_schedules", "nightly") == ["success: Resumed 1 schedule: nightly"]
    assert run("remove_schedules", "hourly") == ["warning: No action selected."]  # refused
    remover = staff_client("view_schedule", "remove_schedule")
    asked = remover.post(
        SCHEDULES, {"action": "remove_schedules", "_selected_action": ["hourly"], "index": "0"}
    )
    # Asked first, as Django asks before a delete: nothing removed yet.
    text = html.unescape(asked.content.decode())
    assert "Remove 1 schedule?" in text and "<li>hourly: ping, 0 * * * *</li>" in text
    assert value(queue, "select count(*) from graphile_worker._private_py_schedules") == 2
    done = confirm(remover, asked)
    assert said(done) == ["success: Removed 1 schedule: hourly"]
    left = rows(queue, "select identifier, paused from graphile_worker._private_py_schedules")
    assert left == [{"identifier": "nightly", "paused": False}]


# --- bounded on many jobs ---------------------------------------------------------


def test_a_list_of_many_jobs_never_counts_the_whole_table(queue: str) -> None:
    """25,000 jobs: every count is over a LIMITed subquery, the filters look
    at a window of 10,000 ids, and the page says 10,000+."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(
            "select graphile_worker.add_jobs(array(select row(case when i % 1000 = 0 "
            "then 'rare' else 'bulk' end, json_build_object('n', i), null, null, null, null, "
            "null, null)::graphile_worker.job_spec from generate_series(1, 25000) as i))"
        )
        conn.execute("analyze graphile_worker._private_jobs")
    newest = value(queue, f"select max(id) from {JOBS}")
    client = staff_client("view_job", "retry_job")

    def read(params: dict[str, str]) -> tuple[Any, list[str]]:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(LIST, params)
        assert page.status_code == 200
        return page, [query["sql"] for query in queries.captured_queries]

    page, sql = read({})
    text = page.content.decode()
    assert "10,000+ jobs" in text and not re.search(r"Select all [\d,]+ jobs", text)
    assert len(cells(page, "id")) == 50
    _no_unbounded_count(sql)
    # A filter: the rare task among the newest 10,000 (10 jobs), said so.
    page, sql = read({"task": "rare"})
    _no_unbounded_count(sql)
    ids = [int(cell) for cell in cells(page, "id")]
    assert len(ids) == 10 and min(ids) > newest - 10_000
    assert "The filters look at 10,000 jobs at most" in page.content.decode()
    older = re.search(r'href="([^"]*)" id="graphile-worker-older"', page.content.decode())
    assert older
    page, sql = read(dict(re.findall(r"(\w+)=(\w+)", html.unescape(older.group(1)))))
    _no_unbounded_count(sql)
    assert [int(c) for c in cells(page, "id")] == [i - 10_000 for i in ids]
    # Sorted by id only (either way), whatever column the query string names.
    for order in ("1", "-2", "5", "0"):  # task, queue, run_at, id
        page, sql = read({"o": order})
        orders = [s.rpartition(" ORDER BY ")[2] for s in sql if '"_private_jobs"' in s]
        by_id = ('"graphile_worker"."_private_jobs"."id" ', "1 ")  # the count's: its 1st column
        assert orders and all(o.startswith(by_id) for o in orders), orders
        assert len(cells(page, "id")) == 50
    # A page far down the list: at most the cap's pages.
    assert client.get(LIST, {"p": "202"}).status_code == 302  # beyond: ?e=1
    # Select all on the plain list would be more than an action takes: refused.
    done = client.post(
        LIST,
        {
            "action": "retry_jobs",
            "_selected_action": [str(newest)],
            "select_across": "1",
            "index": "0",
        },
    )
    assert said(client.get(done["Location"]))[0].startswith(
        "error: More than 10,000 jobs are selected, and an action acts on at most 10,000"
    )


def _no_unbounded_count(statements: list[str]) -> None:
    """Every count of the jobs table is over a LIMITed subquery, and every
    read of it has a LIMIT or an id bound."""
    jobs = [sql for sql in statements if '"_private_jobs"' in sql]
    assert jobs
    for sql in jobs:
        if "COUNT(" in sql.upper():
            assert re.search(r"LIMIT \d+\) subquery$", sql), sql
        else:
            assert "LIMIT" in sql or '"_private_jobs"."id" >= ' in sql, sql


# --- the schema ------------------------------------------------------------------

#: Run by ``manage.py shell``: the job list as a superuser sees it (the ids
#: shown, or the messages of the page it was sent to).
SEE_THE_LIST = """
import html, re
from django.contrib.auth.models import User
from django.test import Client

user = User.objects.create_superuser("schema-check", "s@example.com", "pw")
try:
    client = Client()
    client.force_login(user)
    page = client.get("/admin/graphile_worker/job/", follow=True).content.decode()
    print(re.findall(r'class="field-id"><a [^>]*>(\\d+)<', page))
    print([html.unescape(m) for m in re.findall(r'<li class="error">(.*?)</li>', page)])
finally:
    user.delete()
"""


def test_the_pages_read_the_backends_schema_and_say_when_it_is_missing(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_sync_worker_utils(queue, schema="other_queue") as utils:
        utils.migrate()
        job_id = utils.add_job("elsewhere", {}).id
    add(queue)  # in graphile_worker: not shown
    monkeypatch.setenv("DJANGO_GRAPHILE_SCHEMA", "other_queue")
    try:
        done = manage("shell", "-v", "0", "-c", SEE_THE_LIST)
    finally:
        with psycopg.connect(queue, autocommit=True) as conn:
            conn.execute("drop schema other_queue cascade")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"['{job_id}']", "[]"]
    monkeypatch.setenv("DJANGO_GRAPHILE_SCHEMA", "no_such_queue")
    done = manage("shell", "-v", "0", "-c", SEE_THE_LIST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[]",
        "[\"Graphile-worker's schema 'no_such_queue' is not installed (or not migrated) in "
        "database 'default': run `python manage.py graphile_worker --schema-only`\"]",
    ]


# --- a project without the admin --------------------------------------------------


def test_a_project_without_the_admin_starts_and_enqueues(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DJANGO_NO_ADMIN", "1")
    done = manage("check", "--database", "default")
    assert done.returncode == 0, done.stderr
    script = (
        "import sys\n"
        "from django.conf import settings\n"
        "print('django.contrib.admin' in settings.INSTALLED_APPS)\n"
        "from jobsapp.tasks import add\n"
        "print(add.enqueue(1, 2).status)\n"
        "from worker_cli.contrib.django.models import Job\n"
        "print(Job.objects.with_state().get().state)\n"
        "print('worker_cli.contrib.django.admin' in sys.modules)\n"
    )
    done = manage("shell", "-v", "0", "-c", script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "READY", "waiting", "False"]
