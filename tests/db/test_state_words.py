"""One vocabulary for a job's state (issue 43), as a user meets it: every
word ``job ID``, ``jobs`` and ``status`` print is one ``jobs --state``
takes; the dashboard's list and a job's page say the same word; a job held
by a pause reads ``paused``, with what paused it, everywhere; a ``--once``
run that leaves jobs held by a pause says so."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import COOKIE, dashboard, http
from dbhelpers import admin_cli, rows, run_cli, value

from worker_cli.client.worker_utils import make_worker_utils

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def add(db: str, task: str, **options: Any) -> int:
    """A job added with graphile-worker's add_job (keyword arguments: its own)."""
    named = "".join(f", {name} => %({name})s" for name in options)
    query = f"select (graphile_worker.add_job(%(task)s{named})).id"
    return int(value(db, query, {"task": task, **options}))


def set_job(db: str, job_id: int, assignments: str) -> None:
    rows(db, f"update {JOBS} set {assignments} where id = %s", (job_id,))


def job_line(db: str, job_id: int) -> str:
    """The first line of ``graphile-worker job ID``: ``Job 7: <state>...``."""
    return ok(admin_cli("job", str(job_id), "-c", db)).splitlines()[0]


def job_json(db: str, job_id: int) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(ok(admin_cli("job", str(job_id), "-c", db, "--json")))
    return document


def listed(db: str, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(ok(admin_cli("jobs", "-c", db, "--json", *args)))
    return found


@pytest.fixture
def every_state(db: str) -> dict[str, int]:
    """A job in each state of the jobs table, and a cancelled one (in the
    history); their ids by state."""
    ids = {
        "waiting": add(db, "charge"),
        "scheduled": add(db, "charge", run_at="2099-01-01T00:00:00Z"),
        "retrying": add(db, "charge"),
        "failed": add(db, "charge", max_attempts=2),
        "running": add(db, "charge"),
        "paused": add(db, "email", queue_name="mail"),
        "cancelled": add(db, "charge"),
    }
    set_job(db, ids["retrying"], "attempts = 1, last_error = 'boom'")
    set_job(db, ids["failed"], "attempts = 2, last_error = 'declined'")
    set_job(db, ids["running"], "locked_at = now(), locked_by = 'pool-a', attempts = 1")
    ok(admin_cli("pause", "-c", db, "--queue", "mail"))
    ok(admin_cli("cancel", "-c", db, str(ids["cancelled"])))
    return ids


def test_job_prints_the_word_jobs_state_takes(db: str, every_state: dict[str, int]) -> None:
    for state, job_id in every_state.items():
        assert job_json(db, job_id)["state"] == state, state
        assert job_line(db, job_id).split()[2] == state, state
        chosen = admin_cli("jobs", "-c", db, "--json", "--state", state)
        # a finished job's word is taken too, and selects no job of the jobs table
        expected = [] if state == "cancelled" else [job_id]
        assert [entry["id"] for entry in json.loads(ok(chosen))] == expected, state


def test_every_word_a_command_prints_is_taken_by_jobs_state(
    db: str, every_state: dict[str, int]
) -> None:
    printed = {job_json(db, job_id)["state"] for job_id in every_state.values()}
    printed |= {entry["state"] for entry in listed(db)}
    figures = json.loads(ok(admin_cli("status", "-c", db, "--json")))
    printed |= set(figures["jobs"]) - {"total"}
    text = ok(admin_cli("status", "-c", db))
    printed |= set(re.findall(r"^  (\w+): \d+ ", text, re.M))
    printed |= {"unknown", "succeeded", "removed"}  # job ID of a job gone, finished or removed
    assert {"waiting", "scheduled", "retrying", "paused", "running", "failed"} <= printed
    for word in sorted(printed):
        assert admin_cli("jobs", "-c", db, "--state", word).returncode == 0, word
    # and the old words print nowhere
    everything = " ".join(
        [
            ok(admin_cli("jobs", "-c", db)),
            text,
            *(ok(admin_cli("job", str(job_id), "-c", db)) for job_id in every_state.values()),
        ]
    )
    for old in ("available", r"\blocked\b(?! by)", "permanently.failed"):
        assert not re.search(old, everything), old


def test_a_paused_job_reads_paused_with_its_pause(db: str) -> None:
    held = add(db, "email", queue_name="mail")
    free = add(db, "email")
    ok(admin_cli("pause", "-c", db, "--queue", "mail"))

    assert job_line(db, held) == f"Job {held}: paused (queue mail)"
    assert job_line(db, free) == f"Job {free}: waiting"
    record = job_json(db, held)
    assert (record["state"], record["paused_by"]) == ("paused", "queue mail")
    assert {e["id"]: (e["state"], e["paused_by"]) for e in listed(db)} == {
        held: ("paused", "queue mail"),
        free: ("waiting", None),
    }
    table = ok(admin_cli("jobs", "-c", db)).splitlines()
    row = next(line for line in table if line.split()[0] == str(held))
    assert "paused (queue mail)" in row
    assert [e["id"] for e in listed(db, "--state", "paused")] == [held]

    figures = json.loads(ok(admin_cli("status", "-c", db, "--json")))
    assert (figures["jobs"]["paused"], figures["jobs"]["waiting"]) == (1, 1)
    assert figures["paused_by"] == {"queue mail": 1}
    assert figures["queues"]["mail"]["paused"] == 1
    assert "  paused: 1  (held by a pause: queue mail 1)" in ok(admin_cli("status", "-c", db))

    # A pause of every task holds both; it names itself so.
    ok(admin_cli("pause", "-c", db, "--task", "*"))
    assert job_line(db, free) == f"Job {free}: paused (every task)"
    assert job_line(db, held) == f"Job {held}: paused (queue mail)"  # the queue's first
    ok(admin_cli("resume", "-c", db, "--queue", "mail"))
    ok(admin_cli("resume", "-c", db, "--task", "*"))
    assert job_line(db, held) == f"Job {held}: waiting"


async def test_get_job_status_says_paused(db: str) -> None:
    held = add(db, "email", queue_name="mail")
    async with make_worker_utils(db) as utils:
        assert await utils.get_job_status(held) == "waiting"
        await utils.pause(queue="mail")
        assert await utils.get_job_status(held) == "paused"
        assert (await utils.get_job_result(held)).paused_by == "queue mail"


def _page_state(page: str) -> str:
    found = re.search(r'<span id="job-state"><span class="badge badge-(\w+)">(\w+)</span>', page)
    assert found is not None, page[-800:]
    assert found[1] == found[2]
    return found[2]


def _list_states(page: str) -> dict[int, str]:
    return {
        int(job_id): state
        for job_id, state in re.findall(
            r'<tr data-job="(\d+)">.*?<span class="badge badge-\w+">([\w ]+)</span>',
            page,
            re.DOTALL,
        )
    }


def test_the_dashboard_list_and_job_page_say_the_same_word(
    db: str, every_state: dict[str, int]
) -> None:
    live = {state: job_id for state, job_id in every_state.items() if state != "cancelled"}
    with dashboard(db, refresh=0) as url:
        page = http(url + "/jobs", headers={"Cookie": COOKIE})
        assert page.status == 200
        states = _list_states(page.body)
        assert states == {job_id: state for state, job_id in live.items()}
        held_row = re.search(rf'<tr data-job="{live["paused"]}">(.*?)</tr>', page.body, re.DOTALL)
        assert held_row is not None and "(queue mail)" in held_row[1]
        for state, job_id in live.items():
            job_page = http(url + f"/jobs/{job_id}", headers={"Cookie": COOKIE})
            assert _page_state(job_page.body) == state, state
            filtered = http(url + f"/jobs?state={state}", headers={"Cookie": COOKIE})
            assert list(_list_states(filtered.body)) == [job_id], state
        held = http(url + f"/jobs/{live['paused']}", headers={"Cookie": COOKIE}).body
        assert 'id="job-paused-by">(queue mail)</span>' in held
        # an earlier version's link still filters, by the new word
        old = http(url + "/jobs?state=permanently_failed", headers={"Cookie": COOKIE})
        assert old.status == 200 and list(_list_states(old.body)) == [live["failed"]]
        overview = http(url + "/", headers={"Cookie": COOKIE}).body
        for state in live:
            assert re.search(rf'id="count-{state}"><span class="count[^"]*"[^>]*>1<', overview), (
                state
            )


TASK = "def task(payload, helpers):\n    pass\n"


def test_once_on_a_paused_queue_says_jobs_are_held(db: str, tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "email.py").write_text(TASK)
    for _ in range(3):
        add(db, "email", queue_name="mail")
    add(db, "email")
    ok(admin_cli("pause", "-c", db, "--queue", "mail"))

    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    held = [line for line in result.stderr.splitlines() if "held by pauses" in line]
    assert len(held) == 1, result.stderr
    assert "Left 3 due jobs held by pauses: queue mail (3)" in held[0]
    assert value(db, f"select count(*) from {JOBS}") == 3

    ok(admin_cli("resume", "-c", db, "--queue", "mail"))
    result = run_cli("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "held by pauses" not in result.stderr
    assert value(db, f"select count(*) from {JOBS}") == 0
