"""The dashboard's pieces that need no database: counts as shown, the sample's
size, credentials, CSRF tokens, loopback addresses, the Finished view's
cursor and bounds, results as shown, and the command without its extra."""

from __future__ import annotations

import base64
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from worker_cli.dashboard.finished import (
    FinishedFilter,
    finished_filter_of,
    parse_finished_cursor,
)
from worker_cli.dashboard.formatting import duration, pretty_json, pretty_result, relative
from worker_cli.dashboard.inputs import (
    BadInput,
    checked_text,
    parse_cursor,
    parse_job_id,
    parse_run_at,
)
from worker_cli.dashboard.job_counts import SAMPLE_PAGES, Count, sample_percent
from worker_cli.dashboard.security import (
    AllowedHosts,
    BasicAuth,
    Csrf,
    foreign_post,
    host_name,
    is_loopback,
    route_path,
)
from worker_cli.dashboard.serve import refuse_unprotected
from worker_cli.errors import ConfigurationError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (Count(1234), "1,234"),
        (Count(50, at_least=True), "50+"),
        (Count(2_345_678, exact=False), "~2.3M"),
        (Count(23_456_789, exact=False), "~23M"),
        (Count(45_210, exact=False), "~45k"),
        (Count(447, exact=False), "~450"),
        (Count(7.4, exact=False), "~7"),
        (Count(0.2, exact=False), "~0"),
        (Count(1_500_000_000, exact=False), "~1.5G"),
    ],
)
def test_counts_say_whether_they_are_estimates(count: Count, shown: str) -> None:
    assert str(count) == shown


def test_the_sample_reads_every_page_of_a_small_table_and_a_bounded_share_of_a_large_one() -> None:
    assert sample_percent(0) == sample_percent(SAMPLE_PAGES) == 100.0
    assert sample_percent(SAMPLE_PAGES * 10) == pytest.approx(10.0)
    assert sample_percent(SAMPLE_PAGES * 1000) * SAMPLE_PAGES * 1000 / 100 == pytest.approx(
        SAMPLE_PAGES
    )


def header(credentials: bytes) -> str:
    return "Basic " + base64.b64encode(credentials).decode()


def test_basic_auth() -> None:
    auth = BasicAuth.parse("admin:pa:ss")
    assert auth == BasicAuth("admin", "pa:ss")
    assert "pa:ss" not in repr(auth)
    assert auth.accepts(header(b"admin:pa:ss"))
    assert auth.accepts("basic " + base64.b64encode(b"admin:pa:ss").decode())
    for wrong in (None, "", header(b"admin:pa"), header(b"Admin:pa:ss"), "Bearer x", "Basic !!"):
        assert not auth.accepts(wrong)
    for bad in ("admin", ":pw", "admin:", ""):
        with pytest.raises(ValueError, match="expected USER:PASSWORD"):
            BasicAuth.parse(bad)


def test_csrf_tokens_belong_to_their_nonce_and_secret() -> None:
    csrf = Csrf(b"k" * 32)
    nonce = Csrf.new_nonce()
    token = csrf.token(nonce)
    assert csrf.valid(nonce, token)
    assert not csrf.valid(Csrf.new_nonce(), token)
    assert not csrf.valid(nonce, None) and not csrf.valid(None, token)
    assert not Csrf(b"x" * 32).valid(nonce, token)  # another server's secret
    assert not csrf.valid(nonce, "é" * 64)  # not ASCII: wrong, not a TypeError


def test_job_ids_and_cursors_only_in_bigints_range() -> None:
    assert parse_job_id("1") == 1 and parse_job_id(str(2**63 - 1)) == 2**63 - 1
    for text in ("0", "-1", str(2**63), "9" * 5000, "²", "١٢", "1.0", " 1", ""):
        assert parse_job_id(text) is None, text
    assert parse_cursor("42") == 42
    with pytest.raises(BadInput, match=r"bad cursor '9{40}…'"):
        parse_cursor("9" * 5000)


def test_text_and_times_the_database_would_refuse() -> None:
    assert checked_text("fine", "task") == "fine"
    with pytest.raises(BadInput, match=r"task: 'a\\x00b' contains a NUL character"):
        checked_text("a\x00b", "task")
    assert parse_run_at("2026-12-01T09:00") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    for text in ("9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00"):
        with pytest.raises(BadInput, match="outside the years 1 to 9999"):
            parse_run_at(text)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_password(host: str) -> None:
    assert is_loopback(host)
    refuse_unprotected(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "nowhere.invalid"])
def test_any_other_address_needs_a_password(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError, match="without authentication"):
        refuse_unprotected(host, None)
    refuse_unprotected(host, BasicAuth("a", "b"))


def test_host_names_as_the_host_check_compares_them() -> None:
    assert host_name("Attacker.Example:18080") == "attacker.example"
    assert host_name("[::1]:8080") == host_name("https://[::1]/x") == "::1"
    assert host_name("localhost.") == "localhost"
    for malformed in (None, "", "a b", "localhost/x", "u@localhost", "127.0.0.1:x", "::1"):
        assert host_name(malformed) is None, malformed
    hosts = AllowedHosts(["dash.example:8443", "a.example, b.example", "::1"])
    assert hosts.names == {"localhost", "dash.example", "a.example", "b.example", "::1"}
    server = {"server": ("10.1.2.3", 8080)}
    assert hosts.allows("10.1.2.3", server) and hosts.allows("localhost", server)
    assert not hosts.allows("10.1.2.4", server) and not hosts.allows(None, server)
    with pytest.raises(ValueError, match="not a host name"):
        AllowedHosts(["http://dash.example/"])


def test_posts_from_another_site() -> None:
    own = {"host": "127.0.0.1:8080"}
    assert foreign_post(own, None) is None  # no Origin, no Referer: no browser's form
    assert foreign_post({**own, "origin": "http://127.0.0.1:8080"}, None) is None
    assert foreign_post({**own, "referer": "http://127.0.0.1:8080/jobs/1"}, None) is None
    # X-Forwarded-Host is the client's to send: only Host and the allowed names count.
    proxied = {**own, "x-forwarded-host": "q.example", "origin": "https://q.example"}
    assert foreign_post(proxied, None) is not None
    assert foreign_post(proxied, AllowedHosts(["q.example"])) is None
    assert foreign_post({**own, "origin": "https://q.example"}, AllowedHosts(["q.example"])) is None
    for foreign in (
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"referer": "http://evil.example/"},
        {"sec-fetch-site": "same-site"},
        {"sec-fetch-site": "cross-site"},
    ):
        assert foreign_post({**own, **foreign}, None) is not None, foreign


def test_route_path_strips_the_mount_prefix() -> None:
    assert route_path({"path": "/admin/queue/healthz", "root_path": "/admin/queue"}) == "/healthz"
    assert route_path({"path": "/admin/queue", "root_path": "/admin/queue"}) == "/"
    assert route_path({"path": "/healthz", "root_path": ""}) == "/healthz"


def test_formatting() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert relative(now - timedelta(seconds=75), now) == "1m 15s ago"
    assert relative(now + timedelta(hours=2), now) == "in 2h 00m"
    assert pretty_json('{"a": [1, "<b>"]}') == '{\n  "a": [\n    1,\n    "<b>"\n  ]\n}'


def test_the_command_without_its_extra_names_it() -> None:
    """Starlette missing (as without the extra): one line naming the extra."""
    script = (
        "import sys; sys.modules['starlette'] = None; "
        "sys.argv = ['graphile-worker', 'dashboard', '-c', 'postgres://nowhere/x']; "
        "from worker_cli.cli.commands import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: the dashboard needs Starlette, uvicorn and Jinja2: install the dashboard extra: "
        "pip install 'graphile-worker[dashboard]' "
        "(or pip install '.[dashboard]' in a checkout of the repository)"
    ]
    import_worker = "import sys; sys.modules['starlette'] = None; import worker_cli, worker_cli.cli"
    assert subprocess.run([sys.executable, "-c", import_worker], timeout=60).returncode == 0


def test_the_finished_cursor_is_a_job_id() -> None:
    assert parse_finished_cursor("1234") == 1234
    assert FinishedFilter(cursor=1234).query() == {"cursor": "1234"}


@pytest.mark.parametrize(
    "text", ["", "_5", "2026-11-21T20:49:25Z", "2026-11-21T20:49:25Z_5", "0", "-3", "9" * 40]
)
def test_a_bad_finished_cursor(text: str) -> None:
    with pytest.raises(BadInput, match="bad cursor"):
        parse_finished_cursor(text)


def test_the_finished_filter_from_a_query_string() -> None:
    found, problems = finished_filter_of(
        {"task": "mail", "state": "failed", "after": "2026-03-01T12:00", "cursor": "x"}
    )
    assert (found.task, found.state, found.after) == (
        "mail",
        "failed",
        datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    )
    assert found.cursor is None and problems == ["bad cursor 'x'; showing the newest finished jobs"]
    assert found.query() == {"task": "mail", "state": "failed", "after": "2026-03-01T12:00:00"}
    _, problems = finished_filter_of({"state": "running"})
    assert problems == ["unknown state 'running'; showing every state"]


def test_a_result_as_shown() -> None:
    assert pretty_result('{"a":[1]}', 9) == '{\n  "a": [\n    1\n  ]\n}'
    assert pretty_result(None, None) == ""
    cut = pretty_result("x" * 300_000, 5_000_000)
    assert cut.startswith("x" * 1000) and cut.endswith("(4,800,000 more characters)")
    assert (duration(0.25), duration(42.0), duration(192.0), duration(None)) == (
        "0.25s",
        "42s",
        "3m 12s",
        "",
    )


def test_port_0_binds_one_free_port_for_every_address() -> None:
    """``dashboard --port 0`` (what the tests use: no fixed port): the system
    picks a port, the same on each address ``localhost`` names."""
    from worker_cli.dashboard.serve import bind, bound_port

    sockets = bind("localhost", 0)
    try:
        ports = {sock.getsockname()[1] for sock in sockets}
        assert ports == {bound_port(sockets)} and bound_port(sockets) > 0
    finally:
        for sock in sockets:
            sock.close()
