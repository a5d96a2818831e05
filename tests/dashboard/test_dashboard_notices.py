"""The banner after an action, over HTTP: a refusal (nothing was changed) is
shown as a refusal, not in the green of an action done; and only the
browser whose action it was sees it, once (a one-time signed cookie): no
link can make the dashboard say that something happened."""

from __future__ import annotations

import base64
import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import (
    COOKIE,
    NONCE,
    SECRET,
    TOKEN,
    Reply,
    cookies_set,
    follow,
    http,
    with_cookies,
)
from dashboard_notices import assert_done, assert_refused, banner
from dbhelpers import rows, value

from worker_cli.dashboard.notices import Flash
from worker_cli.dashboard.security import Csrf

pytestmark = pytest.mark.db


def add_job(db: str, **options: Any) -> int:
    names = "".join(f", {name} => %({name})s" for name in options)
    return int(value(db, f"select id from graphile_worker.add_job('hello'{names})", options))


def lock(db: str, job_id: int, pool: str) -> None:
    rows(
        db,
        "update graphile_worker._private_jobs set locked_at = now(), locked_by = %s, "
        "attempts = 1 where id = %s",
        (pool, job_id),
    )


def post(url: str, fields: dict[str, str] | None = None) -> Reply:
    body = urlencode({"csrf_token": TOKEN, **(fields or {})}).encode()
    return http(url, data=body, headers={"Cookie": COOKIE})


def after(base: str, reply: Reply) -> Reply:
    """The page an action's redirect leads to, as the browser gets it."""
    return follow(base, reply, COOKIE)


def test_a_refused_action_is_shown_as_a_refusal(db: str, url: str) -> None:
    running = add_job(db)
    lock(db, running, "pool-busy")
    assert_refused(after(url, post(f"{url}/jobs/{running}/delete")), "locked by a worker")
    assert_refused(after(url, post(f"{url}/jobs/{running}/fail")), "locked by a worker")

    deleted = add_job(db)
    assert_done(after(url, post(f"{url}/jobs/{deleted}/delete")), f"Job {deleted} was deleted")
    assert_refused(after(url, post(f"{url}/jobs/{deleted}/reschedule")), "no longer in the jobs")
    assert_refused(
        after(url, http(f"{url}/jobs/{deleted}/delete", headers={"Cookie": COOKIE})),
        "no longer in the jobs",
    )
    # Cancel: the job had finished already (here: removed, its history's page).
    cancelled = after(url, post(f"{url}/jobs/{deleted}/cancel"))
    assert cancelled.status == 200
    assert_refused(cancelled, "had already finished (removed)")

    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
        "values ('pool-live', interval '1 hour')",
    )
    assert_refused(after(url, post(f"{url}/pools/unlock", {"pool": "pool-live"})), "live heartbeat")


def test_an_action_done_is_shown_as_done(db: str, url: str) -> None:
    job_id = add_job(db, run_at="2099-01-01T00:00:00Z")
    assert_done(after(url, post(f"{url}/jobs/{job_id}/run-now")), "will run now")
    assert_done(after(url, post(f"{url}/jobs/{job_id}/fail")), "permanently failed")
    running = add_job(db)
    lock(db, running, "pool-busy")
    # Asked to stop: done (the request is made), not a refusal.
    assert_done(after(url, post(f"{url}/jobs/{running}/cancel")), "asked to stop it")
    assert_done(after(url, post(f"{url}/pools/unlock", {"pool": "pool-dead"})), "Released")


# --- only this browser's own action, once ----------------------------------------


def flash_cookie(
    kind: str, path: str, *, nonce: str = NONCE, until: float = 0, **values: str
) -> str:
    """A notice cookie as the dashboard signs one (``until``: its expiry)."""
    content = {"kind": kind, "path": path, "until": until or time.time() + 60, **values}
    data = base64.urlsafe_b64encode(json.dumps(content).encode()).decode().rstrip("=")
    signature = Csrf(SECRET).sign("notice", f"{nonce}.{data}")
    return f"{Flash.COOKIE}={data}.{signature}"


@pytest.mark.parametrize(
    "query",
    [
        "/jobs?notice=delete&job=12345",
        "/jobs/{job}?notice=locked&job={job}",
        "/jobs/{job}?notice=cancel&job={job}&state=cancelled",
        "/pools?notice=unlock&pool=pool-x",
        "/?notice=run-now&job=1",
        "/finished?notice=fail&job=1",
        "/jobs/99999?notice=gone&job=99999",
    ],
)
def test_a_pasted_link_shows_no_banner(db: str, url: str, query: str) -> None:
    job_id = add_job(db)
    page = http(url + query.format(job=job_id), headers={"Cookie": COOKIE})
    assert page.status in (200, 404)
    assert 'id="notice"' not in page.body and "was deleted" not in page.body
    assert Flash.COOKIE not in page.headers.get("set-cookie", "")


def test_the_notice_is_shown_once_to_the_browser_whose_action_it_was(db: str, url: str) -> None:
    job_id = add_job(db)
    done = post(f"{url}/jobs/{job_id}/delete")
    assert done.headers["location"] == "/jobs"  # nothing in the link
    [set_cookie] = [h for h in done.headers.get_all("set-cookie") if h.startswith(Flash.COOKIE)]
    assert (
        "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Max-Age=60" in set_cookie
    )

    shown = follow(url, done, COOKIE)
    assert_done(shown, f"Job {job_id} was deleted")
    assert cookies_set(shown)[Flash.COOKIE] == ""  # cleared once shown
    cookie = with_cookies(with_cookies(COOKIE, done), shown)
    assert banner(http(f"{url}/jobs", headers={"Cookie": cookie})) is None  # reloaded
    assert banner(http(f"{url}/jobs", headers={"Cookie": COOKIE})) is None  # the link alone

    # The cookie itself, replayed by another browser (another CSRF nonce): nothing.
    stolen = with_cookies(f"{Csrf.COOKIE}=another-browser", done)
    assert banner(http(f"{url}/jobs", headers={"Cookie": stolen})) is None
    # Kept by this browser, it is shown on its own page only (and left for it).
    kept = with_cookies(COOKIE, done)
    other_page = http(f"{url}/pools", headers={"Cookie": kept})
    assert banner(other_page) is None and Flash.COOKIE not in cookies_set(other_page)


def test_a_notice_cookie_not_signed_by_the_dashboard_shows_nothing(db: str, url: str) -> None:
    job_id = add_job(db)
    path = f"/jobs/{job_id}"

    def page(cookie: str) -> Reply:
        return http(url + path, headers={"Cookie": f"{COOKIE}; {cookie}"})

    genuine = flash_cookie("reschedule", path, job=str(job_id))
    assert_done(page(genuine), f"Job {job_id} was rescheduled")  # the format is right
    name, _, value = genuine.partition("=")
    data, _, signature = value.rpartition(".")
    forged = [
        f"{name}={data}.{'0' * 64}",  # a wrong signature
        f"{name}={data}",  # none
        f"{name}={data[:-2]}xx.{signature}",  # the notice changed
        flash_cookie("reschedule", path, job=str(job_id), until=time.time() - 1),  # expired
        flash_cookie("reschedule", path, nonce="another-browser", job=str(job_id)),
        f"{name}=" + flash_cookie("reschedule", path, job=str(job_id)).split("=", 1)[1] + "é",
    ]
    for cookie in forged:
        reply = page(cookie)
        assert reply.status == 200 and banner(reply) is None, cookie
        assert cookies_set(reply)[Flash.COOKIE] == "", cookie  # cleared
    # Signed with another secret (another dashboard's), or as a form's token: nothing.
    other = Csrf(b"o" * 32).sign("notice", f"{NONCE}.{data}")
    assert banner(page(f"{name}={data}.{other}")) is None
    assert banner(page(f"{name}={data}.{Csrf(SECRET).token(NONCE + '.' + data)}")) is None
