"""DNS rebinding and cross-site posts: the dashboard answers only to its own
address, ``localhost`` and the names it is given (``--allowed-host``,
``allowed_hosts``); a form posted from another origin is refused."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from dashboard_helpers import Reply, http, serve_app, serve_cli
from dbhelpers import rows, run_cli, value
from starlette.applications import Starlette
from starlette.routing import Mount

from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import CONTENT_SECURITY_POLICY

pytestmark = pytest.mark.db


def add_job(db: str) -> int:
    return int(value(db, "select id from graphile_worker.add_job('secret_task', '{\"k\": 7}')"))


def job_row(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(db, "select * from graphile_worker._private_jobs where id = %s", (job_id,))
    return row


def form_of(reply: Reply) -> tuple[str, str]:
    """The CSRF cookie a page set, and the token its form carries."""
    cookie = reply.headers["set-cookie"].split(";")[0]
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', reply.body)
    assert match, reply.body
    return cookie, match.group(1)


def as_host(url: str, host: str, **headers: str) -> Reply:
    """A GET of ``url`` whose Host header says ``host``, as a browser sends it
    to a name rebound to this address."""
    return http(url, headers={"Host": host, **headers})


def assert_refused_host(reply: Reply) -> None:
    assert reply.status == 400, reply.body
    assert reply.headers["content-type"].startswith("text/plain")
    assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "Host header" in reply.body and len(reply.body) < 300
    assert "secret_task" not in reply.body and "csrf" not in reply.body
    assert "set-cookie" not in reply.headers


def test_a_rebound_host_name_gets_400_and_no_page(db: str) -> None:
    """The review's reproduction: with Host: attacker.example:PORT a page was
    read and a reschedule went through."""
    job_id = add_job(db)
    before = job_row(db, job_id)
    with serve_cli(db) as url:
        port = urlsplit(url).port
        evil = f"attacker.example:{port}"
        for path in ("/", "/jobs", f"/jobs/{job_id}", f"/jobs/{job_id}/reschedule", "/healthz"):
            assert_refused_host(as_host(url + path, evil))
        # The token read with a good Host is of no use under the rebound name.
        cookie, token = form_of(http(f"{url}/jobs/{job_id}/reschedule"))
        fields = {"csrf_token": token, "run_at": "2030-01-01T00:00"}
        headers = {"Host": evil, "Cookie": cookie, "Origin": f"http://{evil}"}
        posted = http(
            f"{url}/jobs/{job_id}/reschedule", data=urlencode(fields).encode(), headers=headers
        )
        assert_refused_host(posted)
        assert job_row(db, job_id) == before
        for malformed in ("bad host", "127.0.0.1:x", "user@127.0.0.1", "localhost/x"):
            assert_refused_host(as_host(url + "/", malformed))
        # Its own address and localhost, with or without the port, any case.
        for good in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LocalHost."):
            assert as_host(url + "/", good).status == 200, good


def test_allowed_host_names_from_the_flag_and_the_variable(db: str) -> None:
    flags = ("--allowed-host", "dash.example", "--allowed-host", "other.example:9000")
    with serve_cli(db, *flags) as url:
        assert as_host(url + "/", "dash.example:8443").status == 200
        assert as_host(url + "/", "OTHER.example").status == 200
        assert_refused_host(as_host(url + "/", "attacker.example"))
    env = {"GRAPHILE_WORKER_DASHBOARD_ALLOWED_HOSTS": "a.example, b.example [::1]"}
    with serve_cli(db, env=env) as url:
        for good in ("a.example", "b.example", "[::1]:80"):
            assert as_host(url + "/", good).status == 200, good
        assert_refused_host(as_host(url + "/", "c.example"))
    bad = run_cli("dashboard", "-c", db, "--allowed-host", "http://dash.example/")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "Error: --allowed-host: 'http://dash.example/' is not a host name or address "
        "(no scheme, no path)"
    ]


def test_a_post_from_another_origin_is_refused(db: str) -> None:
    job_id = add_job(db)
    before = job_row(db, job_id)
    with serve_cli(db) as url:
        action = f"{url}/jobs/{job_id}/reschedule"
        cookie, token = form_of(http(action))
        body = urlencode({"csrf_token": token, "run_at": "2030-01-01T00:00"}).encode()

        def post(**headers: str) -> Reply:
            return http(action, data=body, headers={"Cookie": cookie, **headers})

        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Referer": "http://evil.example/page"},
            {"Origin": "http://evil.example", "Referer": f"{url}/jobs"},
            {"Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "cross-site", "Origin": url},
            # Any client can send X-Forwarded-Host: it names no host of ours.
            {"Origin": "http://evil.example", "X-Forwarded-Host": "evil.example"},
            {"Referer": "http://evil.example/", "X-Forwarded-Host": "evil.example, x"},
        ):
            refused = post(**headers)
            assert refused.status == 403, headers
            assert "another site" in refused.body, headers
            assert job_row(db, job_id) == before, headers
        done = post(Origin=url, **{"Sec-Fetch-Site": "same-origin"})
        assert done.status == 303
        assert job_row(db, job_id)["run_at"].year == 2030


def test_mounted_with_allowed_hosts(db: str) -> None:
    """Mounted under a prefix, ``allowed_hosts`` names the application's host;
    the address the request reached still answers (a health check by IP)."""
    dashboard = create_app(db, allowed_hosts=["queue.example.com"])
    app = Starlette(routes=[Mount("/admin/queue", app=dashboard)])
    with serve_app(app) as url:
        base = url + "/admin/queue"
        assert as_host(base + "/", "queue.example.com").status == 200
        assert as_host(base + "/", urlsplit(url).netloc).status == 200
        assert_refused_host(as_host(base + "/", "attacker.example"))
        cookie, token = form_of(as_host(base + "/pools/unlock?pool=p", "queue.example.com"))
        # Behind a proxy that rewrites Host: the browser's Origin is the public name.
        unlock = http(
            base + "/pools/unlock",
            data=urlencode({"csrf_token": token, "pool": "p"}).encode(),
            headers={"Cookie": cookie, "Origin": "https://queue.example.com"},
        )
        assert unlock.status == 303
