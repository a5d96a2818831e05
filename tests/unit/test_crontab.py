"""Parsing and matching crontab lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dbhelpers import run_cli

from worker_cli import CronItem, CrontabError, parse_cron_items, parse_crontab
from worker_cli.jobs.crontab import parse_time_phrase

pytestmark = pytest.mark.unit


ROOT = Path(__file__).resolve().parents[2]
ALL_MINUTES = frozenset(range(60))
ALL_HOURS = frozenset(range(24))
ALL_DATES = frozenset(range(1, 32))
ALL_MONTHS = frozenset(range(1, 13))
ALL_DOWS = frozenset(range(7))

VALID = [
    # The reference README's examples.
    (
        "30 4 * * 1 send_weekly_email",
        {"minutes": {30}, "hours": {4}, "dows": {1}, "task": "send_weekly_email"},
    ),
    (
        "30 4 * * 1 send_weekly_email ?fill=2d&max=10 {onboarding:false}",
        {
            "backfill_period": timedelta(days=2),
            "max_attempts": 10,
            "payload": {"onboarding": False},
        },
    ),
    ("0 */4 * * * rollup", {"minutes": {0}, "hours": {0, 4, 8, 12, 16, 20}}),
    # Fields.
    (
        "* * * * * t",
        {
            "minutes": ALL_MINUTES,
            "hours": ALL_HOURS,
            "dates": ALL_DATES,
            "months": ALL_MONTHS,
            "dows": ALL_DOWS,
        },
    ),
    ("1,2,3 * * * * t", {"minutes": {1, 2, 3}}),
    ("5-8,30 * * * * t", {"minutes": {5, 6, 7, 8, 30}}),
    ("*/20 * * * * t", {"minutes": {0, 20, 40}}),
    ("* * */10 * * t", {"dates": {1, 11, 21, 31}}),
    ("* * * */5 * t", {"months": {1, 6, 11}}),
    ("* * * * 7 t", {"dows": {0}}),
    ("* * * * 5-7 t", {"dows": {5, 6, 0}}),
    ("*/30,15 * * * * t", {"minutes": {0, 15, 30}}),
    # Task names and options.
    (
        "* * * * * users/send:email-2 ?id=daily_mail",
        {"task": "users/send:email-2", "identifier": "daily_mail"},
    ),
    (
        "* * * * * t ?queue=reports:daily&priority=-5",
        {"queue_name": "reports:daily", "priority": -5},
    ),
    (
        "* * * * * t ?jobKey=the%20key&jobKeyMode=preserve_run_at",
        {"job_key": "the key", "job_key_mode": "preserve_run_at"},
    ),
    ("* * * * * t ?fill=4w3d2h1m30s", {"backfill_period": timedelta(minutes=44761, seconds=30)}),
    (
        "* * * * * t {a: [1, 'two'], \"b\": {c: null}, d: 1.5,}",
        {"payload": {"a": [1, "two"], "b": {"c": None}, "d": 1.5}},
    ),
    ("  * * * * * t   ", {"task": "t"}),
]


@pytest.mark.parametrize("line,expected", VALID)
def test_valid_lines(line: str, expected: dict[str, object]) -> None:
    [item] = parse_crontab(line)
    for name, value in expected.items():
        got = getattr(item, name)
        assert (set(got) if isinstance(got, frozenset) else got) == value, name
    if "identifier" not in expected:
        assert item.identifier == item.task


INVALID = [
    ("60 * * * * t", "minute value 60 in '60' is out of range 0-59"),
    ("* 24 * * * t", "hour value 24 in '24' is out of range 0-23"),
    ("* * 0 * * t", "day of month value 0 in '0' is out of range 1-31"),
    ("* * 32 * * t", "day of month value 32"),
    ("* * * 13 * t", "month value 13 in '13' is out of range 1-12"),
    ("* * * * 8 t", "day of week value 8 in '8' is out of range 0-6"),
    ("5-2 * * * * t", "minute range '5-2' must go from a smaller to a larger value"),
    ("3-3 * * * * t", "minute range '3-3' must go from a smaller to a larger value"),
    ("*/0 * * * * t", "minute step in '*/0' must be at least 1"),
    ("1/2 * * * * t", "minute field '1/2' is not a number, a range (a-b), * or */n"),
    ("* * * * t", "is not a crontab line"),
    ("* * * * *", "the task identifier is missing"),
    ("* * * * * 9lives", "invalid task identifier in '9lives'"),
    ("* * * * * t ?foo=1", "unknown option 'foo'"),
    ("* * * * * t ?fill=2y", "invalid time phrase '2y'"),
    ("* * * * * t ?max=0", "max '0' must be a whole number from 1 to 32767"),
    ("* * * * * t ?max=ten", "max 'ten' must be a whole number"),
    ("* * * * * t ?priority=99999", "priority '99999' must be a whole number from -32768 to 32767"),
    ("* * * * * t ?queue=a b", "the payload 'b' must be a JSON5 object"),
    ("* * * * * t ?queue=a!b", "queue 'a!b' may only hold"),
    ("* * * * * t ?id=1abc", "id '1abc' must start with a letter"),
    (
        "* * * * * t ?jobKeyMode=unsafe_dedupe",
        "jobKeyMode 'unsafe_dedupe' must be replace or preserve_run_at",
    ),
    ("* * * * * t ?max=1&max=2", "option 'max' is given twice"),
    ("* * * * * t {a: 1", "the payload '{a: 1' is not valid JSON5"),
    ("* * * * * t [1, 2]", "the payload '[1, 2]' must be a JSON5 object"),
    ("* * * * * t {a: 1} extra", "is not valid JSON5"),
    # Issue 23: what the worker would retry for ever, or what crashed the parser.
    (
        "* * * * * t ?fill=99999999999w",
        "fill '99999999999w' must be from 0 to 366d (a year), the longest backfill",
    ),
    ("* * * * * t ?fill=367d", "fill '367d' must be from 0 to 366d (a year), the longest backfill"),
    (
        "* * * * * t ?fill=" + "9" * 5000 + "s",
        "fill '9999999999999999999999999999999999999999'... (5001 characters) must be from 0 "
        "to 366d",
    ),
    (
        "* * * * * t ?max=" + "9" * 5000,
        "max '9999999999999999999999999999999999999999'... (5000 characters) must be a whole "
        "number from 1 to 32767",
    ),
    (
        "* * * * * t ?priority=-" + "9" * 5000,
        "priority '-999999999999999999999999999999999999999'... (5001 characters) must be a "
        "whole number from -32768 to 32767",
    ),
    (
        "9" * 5000 + " * * * * t",
        "minute value of over 12 digits in '9999999999999999999999999999999999999999'... "
        "(5000 characters) is out of range 0-59",
    ),
    ("1-" + "9" * 5000 + " * * * * t", "minute value 60 in '1-99999999999999999999999999"),
    ("* * * * 5-8 t", "day of week value 8 in '5-8' is out of range 0-6"),
    (
        "* * * * * t ?id=" + "i" * 10_000_000,
        "id '" + "i" * 40 + "'... is 10000000 characters long; the limit is 128",
    ),
    ("* * * * * t ?id=" + "i" * 129, "is 129 characters long; the limit is 128"),
    ("* * * * * " + "t" * 129, "task identifier '" + "t" * 40 + "'... is 129 characters long"),
    ("* * * * * t ?queue=" + "q" * 129, "queue '" + "q" * 40 + "'... is 129 characters long"),
    (
        "* * * * * t {a: Infinity}",
        "the payload cannot be sent as JSON (Out of range float values are not JSON compliant",
    ),
    ("* * * * * t {a: NaN}", "the payload cannot be sent as JSON"),
    ("* * * * * t {a: 1e999}", "the payload cannot be sent as JSON"),
    (
        "x" * 10_000_000,
        "'" + "x" * 40 + "'... (10000000 characters) is not a crontab line",
    ),
]


@pytest.mark.parametrize("line,message", INVALID)
def test_invalid_lines_name_the_line_and_the_problem(line: str, message: str) -> None:
    text = "# a comment\n\n" + line
    with pytest.raises(CrontabError) as info:
        parse_crontab(text)
    assert str(info.value).startswith("crontab line 3: "), str(info.value)
    assert message in str(info.value)


def test_the_limits_themselves_are_accepted() -> None:
    [item] = parse_crontab("* * * * * " + "t" * 128 + " ?fill=366d&id=" + "i" * 128)
    assert item.backfill_period == timedelta(days=366) and item.identifier == "i" * 128
    [item] = parse_crontab("*/99999999999999 * * * * t ?queue=" + "q" * 128 + "&priority=-32768")
    assert item.minutes == {0} and item.queue_name == "q" * 128 and item.priority == -32768
    assert parse_time_phrase("100000000w") == timedelta(weeks=100000000)
    with pytest.raises(CrontabError, match=r"^time phrase '999999999999w' is longer than Python"):
        parse_time_phrase("999999999999w")


def test_duplicate_identifiers() -> None:
    with pytest.raises(
        CrontabError, match=r"crontab line 3: identifier 't' is already used by crontab line 1"
    ):
        parse_crontab("* * * * * t\n0 * * * * t ?id=other\n5 * * * * t")
    assert len(parse_crontab("* * * * * t\n5 * * * * t ?id=t2")) == 2


def test_comments_and_blank_lines() -> None:
    assert parse_crontab("# only a comment\n\n   \n  # indented comment\n") == []


def test_the_example_crontab_parses() -> None:
    items = parse_crontab((ROOT / "crontab.example").read_text())
    assert "hello_every_minute" in {item.identifier for item in items}
    options = {
        (i.backfill_period > timedelta(0), i.max_attempts, i.queue_name, i.priority, i.job_key)
        for i in items
    }
    assert any(o[0] for o in options) and any(o[1] for o in options) and any(o[2] for o in options)
    assert any(o[3] for o in options) and any(o[4] for o in options)


def test_time_phrases() -> None:
    assert parse_time_phrase("90s") == timedelta(seconds=90)
    assert parse_time_phrase("1w") == timedelta(days=7)
    with pytest.raises(CrontabError):
        parse_time_phrase("")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def matches(line: str, *times: str) -> list[bool]:
    [item] = parse_crontab(line)
    return [item.matches(at(t)) for t in times]


def test_day_of_month_and_day_of_week_rules() -> None:
    # 2026-11-01 is a Sunday; 2026-11-02 a Monday; 2026-11-13 a Friday.
    assert matches(
        "0 0 13 * 5 t",
        "2026-11-13 00:00",
        "2026-11-06 00:00",
        "2026-10-13 00:00",
        "2026-11-12 00:00",
    ) == [
        True,
        True,
        True,
        False,  # the 13th OR a Friday
    ]
    assert matches("0 0 13 * * t", "2026-11-13 00:00", "2026-11-06 00:00") == [True, False]
    assert matches("0 0 * * 5 t", "2026-11-13 00:00", "2026-11-12 00:00") == [True, False]
    assert matches("0 0 * * 0 t", "2026-11-01 00:00", "2026-11-02 00:00") == [True, False]
    assert matches("0 0 * * 7 t", "2026-11-01 00:00") == [True]


def test_steps_and_minutes() -> None:
    assert matches(
        "*/15 * * * * t",
        "2026-01-01 10:00",
        "2026-01-01 10:15",
        "2026-01-01 10:16",
        "2026-01-01 10:45",
    ) == [True, True, False, True]
    assert matches("0 */6 * * * t", "2026-01-01 06:00", "2026-01-01 07:00", "2026-01-01 18:00") == [
        True,
        False,
        True,
    ]


def test_month_ends() -> None:
    assert matches("0 0 31 * * t", "2026-01-31 00:00", "2026-03-31 00:00") == [True, True]
    # February and April never have a 31st: nothing between them matches.
    [item] = parse_crontab("0 0 31 * * t")
    ts = at("2026-02-01 00:00")
    days = [ts + timedelta(days=n) for n in range(0, 89)]  # Feb 1 .. Apr 30
    assert [d.date().isoformat() for d in days if item.matches(d)] == ["2026-03-31"]
    assert matches("0 0 29 2 * t", "2028-02-29 00:00", "2026-03-01 00:00") == [True, False]
    assert matches("59 23 28-31 2 * t", "2026-02-28 23:59") == [True]


def test_cron_items_in_library_mode() -> None:
    items = parse_cron_items(
        [
            CronItem(task="report", pattern="0 4 * * *", backfill_period=timedelta(hours=1)),
            {
                "task": "report",
                "pattern": "*/5 * * * *",
                "identifier": "report_often",
                "payload": {"x": 1},
            },
        ]
    )
    assert [i.identifier for i in items] == ["report", "report_often"]
    assert items[1].payload == {"x": 1} and items[0].hours == {4}
    with pytest.raises(
        CrontabError, match="cron item 1: identifier 'report' is already used by cron item 0"
    ):
        parse_cron_items(
            [{"task": "report", "pattern": "* * * * *"}, {"task": "report", "pattern": "0 * * * *"}]
        )
    with pytest.raises(CrontabError, match="cron item 0: invalid cron pattern"):
        parse_cron_items([{"task": "t", "pattern": "* * *"}])
    with pytest.raises(CrontabError, match="cron item 0: minute value 99"):
        parse_cron_items([{"task": "t", "pattern": "99 * * * *"}])
    with pytest.raises(CrontabError, match=r"cron item 0: .*unexpected keyword argument 'every'"):
        parse_cron_items([{"task": "t", "pattern": "* * * * *", "every": 5}])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backfill_period": timedelta(days=367)}, "backfill_period must be from 0 to 366d"),
        ({"backfill_period": timedelta(-1)}, "backfill_period must be from 0 to 366d"),
        ({"identifier": "i" * 129}, "identifier 'iiii"),
        ({"task": "t" * 129}, "task identifier 'tttt"),
        ({"queue_name": "q" * 129}, "queue name 'qqqq"),
        ({"job_key": "k" * 513}, "job_key must be a string of 1 to 512 characters"),
        ({"payload": {"a": float("nan")}}, "the payload cannot be sent as JSON (Out of range"),
        ({"payload": {"a": {1}}}, "the payload cannot be sent as JSON (Object of type set"),
    ],
)
def test_cron_items_in_library_mode_have_the_crontabs_limits(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(CrontabError) as raised:
        parse_cron_items([{"task": "t", "pattern": "* * * * *", **fields}])
    assert str(raised.value).startswith(f"cron item 0: {message}"), str(raised.value)


def test_a_bad_crontab_stops_the_command_with_one_line_naming_file_and_line(
    tmp_path: Path,
) -> None:
    """Before the worker connects: a traceback (an OverflowError) before issue 23."""
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(payload, helpers):\n    pass\n")
    (tmp_path / "crontab").write_text("# every minute\n* * * * * t ?fill=99999999999w\n")
    result = run_cli("-c", "postgres://nobody@127.0.0.1:1/nowhere", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: crontab: crontab line 2: fill '99999999999w' must be from 0 to 366d (a year), "
        "the longest backfill"
    ]
