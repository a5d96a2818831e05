"""The dashboard's defences, over plain HTTP: authentication, CSRF, security
headers on every response, loopback only without a password, /healthz."""

from __future__ import annotations

import re
import socket
from urllib.parse import urlencode

import pytest
from dashboard_helpers import Reply, follow, http, serve_app, serve_cli
from dbhelpers import rows, run_cli, value

from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import CONTENT_SECURITY_POLICY, Csrf

pytestmark = pytest.mark.db


def add_job(db: str, task: str = "hello") -> int:
    return int(value(db, "select id from graphile_worker.add_job(%s)", (task,)))


def exists(db: str, job_id: int) -> bool:
    return bool(
        value(db, "select count(*) from graphile_worker._private_jobs where id = %s", (job_id,))
    )


def form_of(reply: Reply) -> tuple[str, str]:
    """The CSRF cookie a page set, and the token its form carries."""
    cookie = reply.headers["set-cookie"].split(";")[0]
    match = re.search(r'name="csrf_token" value="([0-9a-f]+)"', reply.body)
    assert match, reply.body
    return cookie, match.group(1)


def post(url: str, fields: dict[str, str], **headers: str) -> Reply:
    return http(url, data=urlencode(fields).encode(), headers=headers)


def test_a_post_without_its_token_is_refused_and_changes_nothing(db: str) -> None:
    job_id = add_job(db)
    with serve_cli(db) as url:
        action = f"{url}/jobs/{job_id}/delete"
        cookie, token = form_of(http(action))
        other_cookie, _ = form_of(http(action))
        refused = [
            post(action, {}, Cookie=cookie),  # no token
            post(action, {"csrf_token": token}),  # no cookie
            post(action, {"csrf_token": "0" * 64}, Cookie=cookie),  # a wrong token
            post(action, {"csrf_token": token}, Cookie=other_cookie),  # another browser's
            post(action, {"csrf_token": token}, Cookie=cookie, **{"Sec-Fetch-Site": "cross-site"}),
            http(action, data=b"{}", headers={"Cookie": cookie, "Content-Type": "text/plain"}),
        ]
        assert [reply.status for reply in refused] == [403] * len(refused)
        assert "security token" in refused[0].body
        assert exists(db, job_id)

        done = post(action, {"csrf_token": token}, Cookie=cookie)
        assert done.status == 303
        assert done.headers["location"] == "/jobs"
        assert f"Job {job_id} was deleted" in follow(url, done, cookie).body
        assert not exists(db, job_id)


def test_authentication_from_the_environment(db: str) -> None:
    env = {"GRAPHILE_WORKER_DASHBOARD_AUTH": "admin:s3cret:with-colon"}
    with serve_cli(db, env=env) as url:
        anonymous = http(url + "/")
        assert anonymous.status == 401
        assert anonymous.headers["www-authenticate"].startswith('Basic realm="graphile-worker')
        assert anonymous.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        wrong = http(url + "/", headers={"Authorization": "Basic YWRtaW46bm9wZQ=="})
        assert wrong.status == 401
        assert http(url + "/static/dashboard.css").status == 401
        good = "Basic " + __import__("base64").b64encode(b"admin:s3cret:with-colon").decode()
        assert http(url + "/", headers={"Authorization": good}).status == 200
        assert http(url + "/healthz").status == 200  # no credentials needed, nothing shown


def test_only_loopback_without_authentication(db: str) -> None:
    refused = run_cli("dashboard", "-c", db, "--host", "0.0.0.0", "--port", "1")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "Error: refusing to serve the dashboard on '0.0.0.0' without authentication: anyone "
        "who can reach it could see and change the queue; set --auth USER:PASSWORD (or "
        "GRAPHILE_WORKER_DASHBOARD_AUTH), or listen on 127.0.0.1"
    ]
    bad = run_cli("dashboard", "-c", db, "--auth", "nopassword")
    assert bad.returncode == 2
    assert "Invalid value for '--auth'" in bad.stderr
    assert "expected USER:PASSWORD, with a non-empty user and password" in bad.stderr
    assert "nopassword" not in bad.stderr  # never echo what may be a password


def test_a_port_in_use_fails_with_one_line(db: str) -> None:
    """Not uvicorn's log lines and its exit code 3: one line, exit code 1, as
    every other error of the command."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("dashboard", "-c", db, "--port", str(port))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Error: --port: cannot serve the dashboard on 127.0.0.1:{port}: port {port} is "
        "already in use (choose another with --port)"
    ]
    assert result.stdout == ""


def test_security_headers_on_every_response(db: str) -> None:
    job_id = add_job(db)
    with serve_cli(db) as url:
        for path in (
            "/",
            "/jobs",
            f"/jobs/{job_id}",
            "/jobs/999999",
            "/pools",
            "/crontab",
            "/nowhere",
            "/static/dashboard.css",
            "/static/dashboard.js",
            "/healthz",
        ):
            reply = http(url + path)
            assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
            assert reply.headers["x-frame-options"] == "DENY", path
            assert reply.headers["x-content-type-options"] == "nosniff", path
        assert "script-src 'self'" in CONTENT_SECURITY_POLICY
        assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
        page = http(url + "/").body
        assert (
            "<script>" not in page
            and " style=" not in page
            and "http" not in page.split("<body", 1)[0].replace("http-equiv", "")
        )


def test_values_are_escaped_in_the_html(db: str) -> None:
    job_id = int(
        value(
            db,
            "select id from graphile_worker.add_job('t', %s::json)",
            ('{"x": "<script>alert(1)</script>"}',),
        )
    )
    rows(
        db,
        "update graphile_worker._private_jobs set attempts = 25, last_error = %s where id = %s",
        ("<img src=x onerror=alert(2)>", job_id),
    )
    with serve_cli(db) as url:
        for path in ("/", "/jobs", f"/jobs/{job_id}"):
            body = http(url + path).body
            assert "<img src=x" not in body and "<script>alert" not in body, path
            assert "&lt;img src=x onerror=alert(2)&gt;" in body, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in http(f"{url}/jobs/{job_id}").body


def test_without_the_schema(empty_db: str) -> None:
    # --port 0: whatever serves 8080 (the default) on this machine, the
    # schema's absence is what is said.
    refused = run_cli("dashboard", "-c", empty_db, "--port", "0")
    assert refused.returncode == 1
    assert "is not installed in this database" in refused.stderr
    with serve_app(create_app(empty_db)) as url:
        assert http(url + "/healthz").status == 503
        assert http(url + "/healthz").body == "unavailable\n"
        page = http(url + "/")
        assert page.status == 503
        assert "is not installed in this database" in page.body


def test_healthz_checks_the_schema_on_every_request(db: str) -> None:
    """Not once per process: a schema dropped under a running dashboard makes
    /healthz answer 503, and the pages say the schema is missing; installed
    again, both recover."""
    with serve_app(create_app(db)) as url:
        assert (http(url + "/healthz").status, http(url + "/healthz").body) == (200, "ok\n")
        assert http(url + "/").status == 200
        rows(db, "drop schema graphile_worker cascade")
        assert http(url + "/").status == 503  # the missing table itself
        page = http(url + "/")  # checked again after that error
        assert page.status == 503
        assert "is not installed in this database" in page.body
        health = http(url + "/healthz")
        assert (health.status, health.body) == (503, "unavailable\n")
        assert run_cli("-c", db, "--schema-only").returncode == 0
        assert http(url + "/healthz").status == 200
        assert http(url + "/").status == 200


def test_read_only_refuses_even_a_valid_post(db: str) -> None:
    """The same POST, with a valid token, is refused read-only and done otherwise."""
    job_id = add_job(db)
    secret, nonce = b"s" * 32, "a-browser"
    fields = {"csrf_token": Csrf(secret).token(nonce)}
    cookie = f"{Csrf.COOKIE}={nonce}"
    with serve_app(create_app(db, read_only=True, csrf_secret=secret)) as url:
        reply = post(f"{url}/jobs/{job_id}/delete", fields, Cookie=cookie)
        assert reply.status == 403 and "read-only" in reply.body
        unlock = post(f"{url}/pools/unlock", {**fields, "pool": "pool-x"}, Cookie=cookie)
        assert unlock.status == 403
    assert exists(db, job_id)
    with serve_app(create_app(db, csrf_secret=secret)) as url:
        assert post(f"{url}/jobs/{job_id}/delete", fields, Cookie=cookie).status == 303
    assert not exists(db, job_id)


def test_the_overview_flags_stranded_tasks(db: str) -> None:
    """Tasks with runnable jobs that no live Python pool runs: a warning panel
    and a badge in the task table, names escaped; nothing while no pool has a
    heartbeat row, nor for a task a live pool runs or one with no runnable job."""
    for task in ("a", "b", "b", "<i>x</i>"):
        add_job(db, task)
    rows(db, "select graphile_worker.add_job('later', run_at => now() + interval '1 day')")
    with serve_app(create_app(db, refresh=0)) as url:
        page = http(url + "/")
        assert page.status == 200
        assert "stranded-panel" not in page.body and "badge-stranded" not in page.body
        rows(
            db,
            "insert into graphile_worker._private_py_heartbeats "
            "(pool_id, timeout, task_identifiers) values ('pool-a', interval '5 minutes', '{a}')",
        )
        page = http(url + "/")
    assert page.status == 200
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    panel = page.body.split('id="stranded-panel"')[1].split("</section>")[0]
    assert "2 tasks with runnable jobs that no live Python worker handles" in panel
    assert "Node workers are not seen" in panel
    assert re.findall(r'<tr data-task="([^"]*)">', panel) == ["&lt;i&gt;x&lt;/i&gt;", "b"]
    counts = re.findall(r'<td class="num">([^<]*)</td>', panel)
    assert counts == ["1", "2"]
    assert "<i>x</i>" not in page.body
    table = page.body.split('id="tasks-table"')[1].split("</table>")[0]
    flagged = re.findall(r'>([^<]+)</a> <span class="badge badge-stranded"', table)
    assert flagged == ["&lt;i&gt;x&lt;/i&gt;", "b"]


def liveness_line(body: str) -> str:
    """The overview's line about the worker pools, as text."""
    found = re.search(r'<p class="[^"]*" id="liveness">(.*?)</p>', body, re.S)
    assert found is not None, body[:3000]
    return " ".join(re.sub(r"<[^>]+>", "", found.group(1)).split())


def test_the_overview_says_which_worker_pools_are_alive(db: str) -> None:
    """From the heartbeats the Worker pools page reads: pools alive (and
    their slots), pools silent past their timeout, and holders of running
    jobs with no heartbeat (a Node worker)."""
    with serve_app(create_app(db, refresh=0)) as url:
        assert liveness_line(http(url + "/").body) == "Worker pools: 0 alive"
        beats = "graphile_worker._private_py_heartbeats"
        rows(
            db,
            f"insert into {beats} (pool_id, timeout, concurrency) values "
            "('pool-a', interval '5 minutes', 4), ('pool-b', interval '5 minutes', 2)",
        )
        rows(
            db,
            f"insert into {beats} (pool_id, timeout, beat_at) "
            "values ('pool-dead', interval '1 minute', now() - interval '10 minutes')",
        )
        node = add_job(db)
        rows(db, "update graphile_worker._private_jobs set locked_at = now(), "
                 "locked_by = 'worker-node' where id = %s", (node,))  # fmt: skip
        page = http(url + "/")
    assert page.status == 200
    assert re.fullmatch(
        r"Worker pools: 2 alive \(6 slots\); 1 silent past its timeout \(dead; last beat "
        r"10m 0\ds ago\); 1 holding jobs without a heartbeat \(Node workers, or heartbeats off\)",
        liveness_line(page.body),
    ), liveness_line(page.body)
    assert 'pools">Worker pools</a>' in page.body.split('id="liveness"')[1].split("</p>")[0]


def test_the_pools_page_says_whose_session_is_gone(db: str) -> None:
    """The Session column: a pool's sign held, gone for how long (its pool is
    declared dead after its grace), or none (only its timeout applies)."""
    rows(
        db,
        "insert into graphile_worker._private_py_heartbeats "
        "(pool_id, timeout, sign_key, sign_missing_since) values "
        "('pool-held', interval '5 minutes', 7, null), "
        "('pool-gone', interval '5 minutes', 8, now() - interval '3 seconds'), "
        "('pool-none', interval '5 minutes', null, null)",
    )
    with serve_app(create_app(db, refresh=0)) as url:
        page = http(url + "/pools")
    assert page.status == 200
    sessions = dict(
        re.findall(r'<tr data-pool="(pool-\w+)">.*?<td class="session">(.*?)</td>', page.body, re.S)
    )
    assert sessions["pool-held"] == "held"
    assert re.search(r">gone for 0?3s</span>$", sessions["pool-gone"]), sessions["pool-gone"]
    assert ">none</span>" in sessions["pool-none"]
