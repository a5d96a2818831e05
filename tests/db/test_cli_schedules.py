"""``graphile-worker schedules`` and ``schedule add|remove|pause|resume``
(issue 46), run as a user runs them: one line saying what happened, the
table and its JSON with each schedule's next run, and bad input refused with
one line naming the field (exit code 1), nothing written."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from dbhelpers import admin_cli, rows, run_cli

pytestmark = pytest.mark.db

SCHEDULES = "graphile_worker._private_py_schedules"


def cli(db: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The command ``args`` on ``db`` (``-c`` given last), with ``stdin``, in
    this process (:func:`dbhelpers.admin_cli`); a few tests below run the
    installed command too."""
    return admin_cli(*args, "-c", db, input=stdin)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], text: str) -> None:
    """Exit code 1, one line on stderr saying ``text``, no traceback, nothing on stdout."""
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(f"Error: {text}"), result.stderr
    assert result.stdout == ""


def stored(db: str) -> list[dict[str, Any]]:
    return rows(db, f"select * from {SCHEDULES} order by identifier")


def next_daily(hour: int, minute: int, zone: str, after: datetime) -> datetime:
    """The first wall time hour:minute of ``zone`` at or after ``after`` (a
    time that exists every day, in UTC), computed here independently."""
    tz = ZoneInfo(zone)
    day: date = after.astimezone(tz).date() - timedelta(days=1)
    while True:
        instant = datetime.combine(day, time(hour, minute), tzinfo=tz).astimezone(UTC)
        if instant >= after:
            return instant
        day += timedelta(days=1)


def minute(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%d %H:%M")


def expected_next(hour: int, minute_: int, zone: str, start: datetime) -> set[str]:
    """The next run as the command prints it, whether it ran just before or
    just after a boundary (``start`` is read before the command)."""
    after = datetime.now(UTC)
    return {minute(next_daily(hour, minute_, zone, at)) for at in (start, after)}


# --- add, replace, pause, resume, remove ---------------------------------------


def test_add_replace_pause_resume_remove(db: str) -> None:
    start = datetime.now(UTC)
    added = ok(
        cli(
            db, "schedule", "add", "nightly", "0 3 * * *", "report", '{"kind": "daily"}',
            "--tz", "Europe/Paris", "--fill", "2d", "--queue", "reports", "--priority", "-2",
            "--max-attempts", "5", "--job-key", "nightly-report",
        )
    )  # fmt: skip
    assert added in {
        f"Added schedule nightly (0 3 * * * in Europe/Paris, task report): next run {at} UTC\n"
        for at in expected_next(3, 0, "Europe/Paris", start)
    }
    (row,) = stored(db)
    assert (row["pattern"], row["task_identifier"], row["payload"], row["tz"]) == (
        "0 3 * * *", "report", {"kind": "daily"}, "Europe/Paris"
    )  # fmt: skip
    assert (row["fill"], row["queue_name"], row["priority"], row["max_attempts"]) == (
        timedelta(days=2), "reports", -2, 5
    )  # fmt: skip
    assert (row["job_key"], row["paused"], row["version"]) == ("nightly-report", False, 1)

    # The same identifier again replaces it: every field is the new one's.
    start = datetime.now(UTC)
    replaced = ok(cli(db, "schedule", "add", "nightly", "30 4 * * *", "report"))
    assert replaced in {
        f"Replaced schedule nightly (30 4 * * *, task report): next run {at} UTC\n"
        for at in expected_next(4, 30, "UTC", start)
    }
    (row,) = stored(db)
    assert (row["pattern"], row["tz"], row["payload"], row["queue_name"], row["version"]) == (
        "30 4 * * *", None, None, None, 2
    )  # fmt: skip

    assert ok(cli(db, "schedule", "pause", "nightly")) == (
        "Paused schedule nightly (30 4 * * *, task report): it adds no job until resumed\n"
    )
    assert stored(db)[0]["paused"] is True
    assert ok(cli(db, "schedule", "pause", "nightly")) == (
        "Schedule nightly (30 4 * * *, task report) was paused already\n"
    )
    start = datetime.now(UTC)
    resumed = ok(cli(db, "schedule", "resume", "nightly"))
    assert resumed in {
        f"Resumed schedule nightly (30 4 * * *, task report): next run {at} UTC\n"
        for at in expected_next(4, 30, "UTC", start)
    }
    assert stored(db)[0]["paused"] is False
    assert ok(cli(db, "schedule", "resume", "nightly")).startswith(
        "Schedule nightly (30 4 * * *, task report) was not paused: next run "
    )

    assert ok(cli(db, "schedule", "remove", "nightly")) == (
        "Removed schedule nightly (the jobs it added stay)\n"
    )
    assert stored(db) == []


def test_add_paused_says_so_and_the_list_shows_no_next_run(db: str) -> None:
    assert ok(cli(db, "schedule", "add", "hourly", "0 * * * *", "tick", "--paused")) == (
        "Added schedule hourly (0 * * * *, task tick), paused: it adds no job until "
        "`graphile-worker schedule resume hourly`\n"
    )
    assert stored(db)[0]["paused"] is True
    table = ok(cli(db, "schedules")).splitlines()
    assert table[1].split() == ["hourly", "0", "*", "*", "*", "*", "UTC", "tick", "yes", "paused",
                                "-", "-"]  # fmt: skip
    (document,) = json.loads(ok(cli(db, "schedules", "--json")))
    assert document["paused"] is True and document["next_run"] is None


@pytest.mark.parametrize("verb", ["remove", "pause", "resume"])
def test_an_unknown_identifier_is_one_line_and_exit_1(db: str, verb: str) -> None:
    ok(cli(db, "schedule", "add", "kept", "0 3 * * *", "report"))
    before = stored(db)
    refused(
        cli(db, "schedule", verb, "nosuch"),
        "no schedule has the identifier 'nosuch': nothing was changed",
    )
    refused(cli(db, "schedule", verb, "1bad"), "identifier: is '1bad'")
    assert stored(db) == before


# --- bad input ------------------------------------------------------------------

BAD = [
    ("never fires", ("x", "0 0 31 2 *", "report"), "pattern: '0 0 31 2 *' never fires"),
    ("bad pattern", ("x", "61 * * * *", "report"), "pattern: "),
    ("unknown zone", ("x", "0 3 * * *", "report", "--tz", "Europe/Pariss"),
     "tz: unknown time zone 'Europe/Pariss'"),
    ("payload not an object", ("x", "0 3 * * *", "report", "[1]"),
     "payload: is a list; a schedule's payload is a dict"),
    ("payload not JSON", ("x", "0 3 * * *", "report", "{kind: 1}"), "payload: not JSON"),
    ("payload file missing", ("x", "0 3 * * *", "report", "@/nonexistent/payload.json"),
     "payload: cannot read '/nonexistent/payload.json'"),
    ("bad fill", ("x", "0 3 * * *", "report", "--fill", "2x"), "fill: invalid time phrase"),
    ("priority", ("x", "0 3 * * *", "report", "--priority", "32768"), "priority: "),
    ("max attempts", ("x", "0 3 * * *", "report", "--max-attempts", "0"), "max_attempts: "),
    ("queue too long", ("x", "0 3 * * *", "report", "--queue", "q" * 129), "queue_name: "),
    ("queue not UTF-8", ("x", "0 3 * * *", "report", "--queue", "mail\udcff"),
     "queue_name: contains a lone surrogate"),
    ("job key", ("x", "0 3 * * *", "report", "--job-key", "k" * 513), "job_key: "),
    ("bad task", ("x", "0 3 * * *", ""), "task_identifier: "),
    ("bad identifier", ("1x", "0 3 * * *", "report"), "identifier: is '1x'"),
]  # fmt: skip


@pytest.fixture
def existing(db: str) -> list[dict[str, Any]]:
    """A schedule ``x`` (the identifier the bad inputs would replace), as stored."""
    ok(cli(db, "schedule", "add", "x", "*/5 * * * *", "report", '{"a": 1}'))
    return stored(db)


@pytest.mark.parametrize(("args", "text"), [case[1:] for case in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_naming_the_field_and_nothing_is_written(
    db: str, existing: list[dict[str, Any]], args: tuple[str, ...], text: str
) -> None:
    refused(cli(db, "schedule", "add", *args), text)
    assert stored(db) == existing


def test_a_10_mb_payload_is_refused_read_from_a_file(
    db: str, existing: list[dict[str, Any]], tmp_path: Path
) -> None:
    # An argument of 10 MB is over Linux's limit on one argument (128 KiB):
    # @PATH reads the payload from a file.
    big = tmp_path / "payload.json"
    big.write_text(json.dumps({"blob": "x" * 10_000_000}))
    refused(
        cli(db, "schedule", "add", "x", "0 3 * * *", "report", f"@{big}"),
        "payload: is 10,000,011 bytes of JSON; a schedule's payload is at most 65,536",
    )
    assert stored(db) == existing
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (17 << 20) + b"{}")  # not even read whole
    refused(
        cli(db, "schedule", "add", "x", "0 3 * * *", "report", f"@{huge}"),
        f"payload: '{huge}' is over 16,777,216 bytes",
    )
    assert stored(db) == existing


def test_the_payload_is_read_from_a_file_or_stdin(db: str, tmp_path: Path) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{\n  "from": "file"\n}\n')
    ok(cli(db, "schedule", "add", "a", "0 3 * * *", "report", f"@{path}"))
    ok(cli(db, "schedule", "add", "b", "0 3 * * *", "report", "@-", stdin='{"from": "stdin"}'))
    assert [row["payload"] for row in stored(db)] == [{"from": "file"}, {"from": "stdin"}]


def test_an_identifier_a_crontab_item_uses_is_refused(
    db: str, existing: list[dict[str, Any]]
) -> None:
    rows(
        db,
        "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
        "values ('legacy', '2026-01-02 03:04+00')",
    )
    refused(
        cli(db, "schedule", "add", "legacy", "0 3 * * *", "report"),
        "identifier: 'legacy' is a crontab item's (a Python or Node worker has run it since "
        "2026-01-02 03:04 UTC)",
    )
    assert stored(db) == existing


# --- the list ---------------------------------------------------------------------


def test_no_schedules(db: str) -> None:
    assert ok(cli(db, "schedules")) == "No schedules.\n"
    assert json.loads(ok(cli(db, "schedules", "--json"))) == []


def test_the_table_and_its_json(db: str) -> None:
    ok(cli(db, "schedule", "add", "paris", "0 3 * * *", "report", "--tz", "Europe/Paris"))
    ok(cli(db, "schedule", "add", "utc", "15 6 * * *", "cleanup", '{"all": true}', "--fill", "1h"))
    # It fired once: its last instant, and the job added 2.5 s after it.
    rows(
        db,
        f"update {SCHEDULES} set last_execution = '2026-03-29 06:15+00', "
        "last_run_at = '2026-03-29 06:15:02.5+00' where identifier = 'utc'",
    )
    start = datetime.now(UTC)
    lines = ok(cli(db, "schedules")).splitlines()
    assert lines[0].split() == ["IDENTIFIER", "PATTERN", "TZ", "TASK", "PAUSED", "NEXT", "RUN",
                                "(UTC)", "LAST", "RUN", "(UTC)", "LAG"]  # fmt: skip
    assert len(lines) == 3
    paris = lines[1].split()
    assert paris[:10] == ["paris", "0", "3", "*", "*", "*", "Europe/Paris", "report", "no",
                          paris[9]]  # fmt: skip
    assert f"{paris[9]} {paris[10]}" in expected_next(3, 0, "Europe/Paris", start)
    assert paris[11:] == ["-", "-"]
    utc = lines[2].split()
    assert utc[:9] == ["utc", "15", "6", "*", "*", "*", "UTC", "cleanup", "no"]
    assert f"{utc[9]} {utc[10]}" in expected_next(6, 15, "UTC", start)
    assert utc[11:] == ["2026-03-29", "06:15", "2.5s"]
    # The columns line up.
    assert lines[0].index("NEXT RUN") == lines[1].index(paris[9]) == lines[2].index(utc[9])

    documents = json.loads(ok(cli(db, "schedules", "--json")))
    assert [document["identifier"] for document in documents] == ["paris", "utc"]
    by_id = {document["identifier"]: document for document in documents}
    assert by_id["utc"]["payload"] == {"all": True}
    assert by_id["utc"]["fill"] == 3600
    assert by_id["utc"]["last_execution"] == "2026-03-29T06:15:00+00:00"
    assert by_id["paris"]["tz"] == "Europe/Paris" and by_id["paris"]["last_execution"] is None
    for name, (hour, minute_, zone) in {"paris": (3, 0, "Europe/Paris"),
                                        "utc": (6, 15, "UTC")}.items():  # fmt: skip
        next_run = datetime.fromisoformat(by_id[name]["next_run"])
        assert next_run.utcoffset() == timedelta(0)
        assert minute(next_run) in expected_next(hour, minute_, zone, start)
    fields = set(by_id["utc"]) - {"next_run"}
    assert fields == {
        "identifier", "pattern", "task_identifier", "payload", "tz", "fill", "queue_name",
        "priority", "max_attempts", "job_key", "paused", "version", "created_at",
        "updated_at", "known_since", "last_execution", "last_run_at",
    }  # fmt: skip


def test_a_schedule_without_a_zone_runs_in_utc_whatever_the_cron_timezone(db: str) -> None:
    # The workers fire it in UTC, whatever their --cron-timezone: so does its next run.
    ok(cli(db, "schedule", "add", "plain", "0 3 * * *", "report"))
    start = datetime.now(UTC)
    listed = run_cli(
        "schedules", "--json", "-c", db, env={"GRAPHILE_WORKER_CRON_TIMEZONE": "Asia/Tokyo"}
    )
    (document,) = json.loads(ok(listed))
    assert minute(datetime.fromisoformat(document["next_run"])) in expected_next(3, 0, "UTC", start)
    assert ok(cli(db, "schedules")).splitlines()[1].split()[6] == "UTC"


def test_an_instant_it_fired_at_is_not_its_next_run(db: str) -> None:
    # Fired at the next instant already (a worker whose clock runs ahead):
    # the one after is next.
    ok(cli(db, "schedule", "add", "daily", "0 3 * * *", "report"))
    first = next_daily(3, 0, "UTC", datetime.now(UTC))
    rows(db, f"update {SCHEDULES} set last_execution = %s", (first,))
    (document,) = json.loads(ok(cli(db, "schedules", "--json")))
    assert datetime.fromisoformat(document["next_run"]) == first + timedelta(days=1)


# --- connection and schema as the other subcommands take them ---------------------


def test_connection_before_the_subcommand_and_from_the_config_file(db: str, tmp_path: Path) -> None:
    added = run_cli("-c", db, "schedule", "add", "early", "0 3 * * *", "report")
    assert added.returncode == 0, added.stderr
    config = tmp_path / "worker.toml"
    config.write_text(f"connection = {json.dumps(db)}\n")
    paused = run_cli("-C", str(config), "schedule", "pause", "early")
    assert paused.returncode == 0, paused.stderr
    assert stored(db)[0]["paused"] is True
    listed = run_cli("-C", str(config), "schedules")
    assert listed.returncode == 0 and "early" in listed.stdout, listed.stderr


def test_the_schema_option(db: str) -> None:
    assert run_cli("-c", db, "-s", "other_schema", "--schema-only").returncode == 0
    ok(cli(db, "schedule", "add", "elsewhere", "0 3 * * *", "report", "-s", "other_schema"))
    assert stored(db) == []
    assert ok(cli(db, "schedules", "-s", "other_schema")).splitlines()[1].startswith("elsewhere")


def test_every_option_has_help() -> None:
    text = ok(run_cli("schedule", "add", "--help"))
    for option in ("--tz ZONE", "--fill PERIOD", "--queue NAME", "--priority", "--max-attempts",
                   "--job-key KEY", "--paused"):  # fmt: skip
        line = next(line for line in text.splitlines() if line.strip().startswith(option))
        assert len(line.strip()) > len(option) + 5, line
    assert "add" in ok(run_cli("schedule", "--help"))
    assert "--json" in ok(run_cli("schedules", "--help"))
