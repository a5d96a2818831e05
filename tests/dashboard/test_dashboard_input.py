"""The user's own bad input gets the dashboard's styled page with 400 (bad
input) or 404 (no such job, no such page): never a 500, never "database
unreachable", and the job is left as it was."""

from __future__ import annotations

from datetime import UTC
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from dashboard_helpers import COOKIE, TOKEN, Reply, http
from dbhelpers import rows, value

pytestmark = pytest.mark.db

HUGE = "9" * 5000  # int() refuses more than 4300 digits
BEYOND_BIGINT = str(2**63)


def add_job(db: str) -> int:
    return int(value(db, "select id from graphile_worker.add_job('hello')"))


def job_row(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(db, "select * from graphile_worker._private_jobs where id = %s", (job_id,))
    return row


def post(url: str, fields: dict[str, str]) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **fields}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def assert_styled(reply: Reply, status: int, says: str) -> None:
    """The dashboard's own page, with this status, saying what is wrong."""
    assert reply.status == status, (reply.status, reply.body[-600:])
    assert reply.headers["content-type"].startswith("text/html")
    assert 'class="topbar"' in reply.body, reply.body
    assert says in reply.body, reply.body[-600:]
    assert "Traceback" not in reply.body and "unreachable" not in reply.body


def test_a_non_ascii_csrf_token_is_refused_like_any_wrong_one(db: str, url: str) -> None:
    job_id = add_job(db)
    reply = post(f"{url}/jobs/{job_id}/delete", {"csrf_token": "é" * 64})
    assert_styled(reply, 403, "security token")
    assert job_row(db, job_id)["id"] == job_id


@pytest.mark.parametrize("cursor", ["²", "١٢", HUGE, BEYOND_BIGINT, "-5", "0"])
def test_a_bad_cursor_is_bad_input(url: str, cursor: str) -> None:
    reply = http(f"{url}/jobs?before={quote(cursor)}")
    assert_styled(reply, 400, "bad cursor")
    assert len(reply.body) < 20_000  # the cursor shown shortened, not 5,000 digits


@pytest.mark.parametrize("job_id", [BEYOND_BIGINT, HUGE, "abc", "-1", "0", "²"])
def test_a_job_id_no_job_can_have_is_no_such_job(db: str, url: str, job_id: str) -> None:
    other = add_job(db)
    path = f"{url}/jobs/{quote(job_id)}"
    assert_styled(http(path), 404, "No such job")
    assert_styled(http(f"{path}/delete"), 404, "No such job")
    assert_styled(post(f"{path}/delete", {}), 404, "No such job")
    assert_styled(post(f"{path}/reschedule", {"run_at": "2030-01-01T00:00"}), 404, "No such job")
    assert job_row(db, other)["id"] == other


@pytest.mark.parametrize("path", ["/nosuch", "/jobs/1/2/3", "/static/nosuch.css"])
def test_an_unknown_address_gets_the_styled_404(url: str, path: str) -> None:
    assert_styled(http(url + path), 404, "Not found")


def test_nul_characters_are_bad_input(db: str, url: str) -> None:
    job_id = add_job(db)
    before = job_row(db, job_id)
    for query in ("task=a%00b", "queue=%00", "task=hello&queue=q%00"):
        assert_styled(http(f"{url}/jobs?{query}"), 400, "NUL character")
    assert_styled(http(f"{url}/pools/unlock?pool=pool%00x"), 400, "NUL character")
    assert_styled(post(f"{url}/pools/unlock", {"pool": "pool\x00x"}), 400, "NUL character")
    failed = post(f"{url}/jobs/{job_id}/fail", {"reason": "bad\x00reason"})
    assert_styled(failed, 400, "NUL character")
    assert 'id="confirm-form"' in failed.body  # the form again, to correct
    cancelled = post(f"{url}/jobs/{job_id}/cancel", {"reason": "bad\x00reason"})
    assert_styled(cancelled, 400, "NUL character")
    assert 'id="cancel-reason"' in cancelled.body
    assert_styled(http(f"{url}/finished?task=a%00b"), 400, "NUL character")
    assert job_row(db, job_id) == before


@pytest.mark.parametrize(
    "run_at", ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00", "10000-01-01T00:00"]
)
def test_a_run_at_outside_the_years_1_to_9999_is_bad_input(db: str, url: str, run_at: str) -> None:
    job_id = add_job(db)
    before = job_row(db, job_id)
    reply = post(f"{url}/jobs/{job_id}/reschedule", {"run_at": run_at})
    assert_styled(reply, 400, "run at")
    assert job_row(db, job_id) == before
    assert http(f"{url}/jobs/{job_id}").status == 200


@pytest.mark.parametrize(
    ("refused", "taken"),
    [("9999-12-31T23:59", "9999-12-30T23:59"), ("0001-01-01T00:00", "0001-01-02T00:00")],
)
def test_a_run_at_a_job_cannot_be_read_back_with_is_bad_input(
    db: str, url: str, refused: str, taken: str
) -> None:
    """Within the years 1 to 9999 in UTC, but not a datetime in every zone a
    job is read back in (reschedule_jobs refuses it): the form again with one
    line, never a 500; the storable end itself is taken."""
    job_id = add_job(db)
    before = job_row(db, job_id)
    reply = post(f"{url}/jobs/{job_id}/reschedule", {"run_at": refused})
    assert_styled(reply, 400, "run at: ")
    assert "0001-01-02 to 9999-12-30 (UTC)" in reply.body
    assert 'id="confirm-form"' in reply.body  # the form again, to correct
    assert job_row(db, job_id) == before
    done = post(f"{url}/jobs/{job_id}/reschedule", {"run_at": taken})
    assert done.status == 303, (done.status, done.body[-600:])
    assert job_row(db, job_id)["run_at"].astimezone(UTC).isoformat().startswith(taken)
    assert http(f"{url}/jobs/{job_id}").status == 200


@pytest.mark.parametrize("run_at", ["-infinity", "0044-03-15 BC", "infinity", "12000-01-01"])
def test_a_job_due_outside_pythons_years_is_shown(db: str, url: str, run_at: str) -> None:
    """add_job accepts such a run_at: every page showing the job still works."""
    job_id = int(
        value(db, "select id from graphile_worker.add_job('odd', run_at => %s)", (run_at,))
    )
    rows(db, "select graphile_worker.add_job('plain')")
    for path in ("/", "/jobs", "/jobs?state=scheduled", f"/jobs/{job_id}", "/pools"):
        reply = http(f"{url}{path}")
        assert reply.status == 200, (path, reply.status, reply.body[-600:])
    assert "odd" in http(f"{url}/jobs").body
    bound = "after 9999-12-31" if run_at in ("infinity", "12000-01-01") else "before 0001-01-01"
    assert bound in http(f"{url}/jobs/{job_id}").body
