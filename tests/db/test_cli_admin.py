"""The admin subcommands (in this process, through click's runner; once as
the installed command): ``jobs`` (the list),
``retry``, ``reschedule``, ``fail``, ``remove``, ``cancel`` and ``migrate``;
their filters, ``--json``, the confirmation, refused input, locked jobs,
nothing matched, and batches."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
from dbhelpers import admin_cli, cli_path, rows, run_cli, value

pytestmark = pytest.mark.db

JOBS = "graphile_worker._private_jobs"


def cli(*args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
    """The command ``args`` in this process (:func:`dbhelpers.admin_cli`), with
    ``answer`` on its stdin (a missing --yes can never hang a test); a test
    below runs the installed command too."""
    return admin_cli(*args, input=answer)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    """Refused with exit ``code``: one ``Error:`` line saying ``text``, no traceback."""
    assert result.returncode == code, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and text in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def add(db: str, task: str, **options: Any) -> int:
    """A job added with graphile-worker's add_job (keyword arguments: its own)."""
    named = ", ".join(f"{name} => %({name})s" for name in options)
    return int(
        value(db, f"select (graphile_worker.add_job(%(task)s{', ' if named else ''}{named})).id",
            {"task": task, **options})
    )  # fmt: skip


def set_job(db: str, job_id: int, assignments: str) -> None:
    rows(db, f"update {JOBS} set {assignments} where id = %s", (job_id,))


def job(db: str, job_id: int) -> dict[str, Any] | None:
    found = rows(db, f"select *, run_at <= now() as due from {JOBS} where id = %s", (job_id,))
    return found[0] if found else None


def snapshot(db: str) -> list[dict[str, Any]]:
    return rows(db, f"select * from {JOBS} order by id")


@pytest.fixture
def mixed(db: str) -> dict[str, int]:
    """charge_card jobs in every state, and two email jobs (named queue
    "mail", keys); returns their ids by name."""
    ids = {
        "waiting": add(db, "charge_card"),
        "retrying": add(db, "charge_card"),
        "scheduled": add(db, "charge_card", run_at="2099-01-01T00:00:00Z"),
        "failed": add(db, "charge_card", max_attempts=3),
        "locked": add(db, "charge_card"),
        "stale": add(db, "charge_card"),
        "welcome": add(db, "email", queue_name="mail", job_key="welcome-7"),
        "later": add(db, "email", job_key="later-1", run_at="2099-01-01T00:00:00Z"),
    }
    set_job(
        db, ids["retrying"], "attempts = 2, last_error = 'boom', run_at = now() - '1m'::interval"
    )
    set_job(db, ids["failed"], "attempts = 3, last_error = e'card declined\\n  at charge()'")
    set_job(db, ids["locked"], "locked_at = now(), locked_by = 'pool-live', attempts = 1")
    set_job(db, ids["stale"], "locked_at = now() - '5h'::interval, locked_by = 'pool-dead'")
    set_job(db, ids["later"], "attempts = 1, last_error = 'timeout'")
    return ids


def listed(db: str, *args: str) -> list[int]:
    return [entry["id"] for entry in json.loads(ok(cli("jobs", "-c", db, "--json", *args)))]


# --- jobs -----------------------------------------------------------------------


def test_jobs_filters_each_alone_and_together(db: str, mixed: dict[str, int]) -> None:
    everything = listed(db)
    assert everything == sorted(mixed.values(), reverse=True)  # newest first
    assert set(listed(db, "--task", "email")) == {mixed["welcome"], mixed["later"]}
    assert listed(db, "--queue", "mail") == [mixed["welcome"]]
    assert listed(db, "--key", "welcome-7") == [mixed["welcome"]]
    assert listed(db, "--id", str(mixed["failed"]), "--id", str(mixed["waiting"])) == [
        mixed["failed"],
        mixed["waiting"],
    ]
    assert listed(db, "--task", "charge_card", "--state", "retrying") == [mixed["retrying"]]
    assert listed(db, "--task", "nosuch") == []
    assert listed(db, "--state", "running") == [mixed["stale"], mixed["locked"]]
    assert listed(db, "--state", "failed") == [mixed["failed"]]
    assert listed(db, "--state", "scheduled") == [mixed["scheduled"]]
    assert set(listed(db, "--state", "waiting")) == {mixed["waiting"], mixed["welcome"]}
    assert set(listed(db, "--state", "retrying")) == {mixed["retrying"], mixed["later"]}
    # Earlier versions' words are still taken, as their new ones.
    assert listed(db, "--state", "locked") == listed(db, "--state", "running")
    assert listed(db, "--state", "permanently_failed") == [mixed["failed"]]
    assert listed(db, "--state", "available") == listed(db, "--state", "waiting")


def test_jobs_states_mean_what_status_counts(db: str, mixed: dict[str, int]) -> None:
    figures = json.loads(ok(run_cli("status", "-c", db, "--json")))
    for state in ("waiting", "scheduled", "retrying", "paused", "running", "failed"):
        for task, counts in figures["tasks"].items():
            assert len(listed(db, "--state", state, "--task", task)) == counts[state], (state, task)
        assert len(listed(db, "--state", state)) == figures["jobs"][state], state


def test_jobs_json_fields_and_text_table(db: str, mixed: dict[str, int]) -> None:
    [failed] = json.loads(ok(cli("jobs", "-c", db, "--json", "--id", str(mixed["failed"]))))
    assert failed["task_identifier"] == "charge_card" and failed["queue_name"] is None
    assert failed["state"] == "failed" and failed["paused_by"] is None
    assert (failed["attempts"], failed["max_attempts"]) == (3, 3)
    assert failed["last_error"] == "card declined\n  at charge()"
    assert failed["run_at"].endswith("+00:00")
    every = json.loads(ok(cli("jobs", "-c", db, "--json")))
    assert {entry["id"]: entry["state"] for entry in every} == {
        mixed["waiting"]: "waiting",
        mixed["retrying"]: "retrying",
        mixed["scheduled"]: "scheduled",
        mixed["failed"]: "failed",
        mixed["locked"]: "running",
        mixed["stale"]: "running",
        mixed["welcome"]: "waiting",
        mixed["later"]: "retrying",
    }
    text = ok(cli("jobs", "-c", db, "--task", "charge_card")).splitlines()
    assert text[0].split() == [
        "id", "task", "queue", "state", "attempts", "run_at", "last_error",
    ]  # fmt: skip
    row = next(line for line in text if line.split()[0] == str(mixed["failed"]))
    assert row.split()[3] == "failed" and "3/3" in row and row.endswith("card declined")
    retrying = next(line for line in text if line.split()[0] == str(mixed["retrying"]))
    assert retrying.split()[3] == "retrying" and "2/25" in retrying
    assert text[-1] == "6 of 6 matching jobs, newest first."
    assert ok(cli("jobs", "-c", db, "--task", "nosuch")).strip() == "No job matches (task nosuch)."


def test_jobs_is_bounded_and_says_how_many_more(db: str, mixed: dict[str, int]) -> None:
    text = ok(cli("jobs", "-c", db, "--limit", "2")).splitlines()
    assert (
        len(text) == 4 and text[-1] == "2 of 8 matching jobs, newest first; 6 more (raise --limit)."
    )
    result = cli("jobs", "-c", db, "--limit", "3", "--json")
    assert len(json.loads(ok(result))) == 3
    assert "5 more match" in result.stderr


def test_jobs_refuses_bad_input(db: str, mixed: dict[str, int]) -> None:
    refused(cli("jobs", "-c", db, "--state", "broken"), 2, "'broken' is not one of")
    refused(cli("jobs", "-c", db, "--id", "x"), 2, "'x' is not a job id")
    refused(cli("jobs", "-c", db, "--limit", "0"), 2, "--limit")
    refused(cli("jobs", "-c", db, "--limit", "10001"), 2, "--limit")


def test_a_database_without_the_schema_is_one_line(empty_db: str) -> None:
    refused(cli("jobs", "-c", empty_db), 1, "is not installed")
    refused(cli("retry", "-c", empty_db, "1"), 1, "is not installed")


# --- choosing the jobs of an action -----------------------------------------------


ACTIONS = ["retry", "fail", "remove", "reschedule", "cancel"]


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_refuses_no_choice_more_than_one_and_bad_ids(
    db: str, mixed: dict[str, int], action: str
) -> None:
    before = snapshot(db)
    extra = ["--priority", "1"] if action == "reschedule" else []
    refused(cli(action, "-c", db, *extra), 2, "refusing to act on every job")
    refused(cli(action, "-c", db, str(mixed["waiting"]), "--task", "x", *extra), 2, "only one")
    refused(cli(action, "-c", db, "--key", "k", "--state", "waiting", *extra), 2, "only one")
    refused(cli(action, "-c", db, "12x", *extra), 2, "'12x' is not a job id")
    refused(cli(action, "-c", db, "--state", "dead", *extra), 2, "'dead' is not one of")
    refused(cli(action, "-c", db, "--key", "nosuch", *extra), 1, "no job has the key 'nosuch'")
    assert snapshot(db) == before


@pytest.mark.parametrize("action", ACTIONS)
def test_a_filter_asks_first_and_no_changes_nothing(
    db: str, mixed: dict[str, int], action: str
) -> None:
    before = snapshot(db)
    extra = ["--priority", "1"] if action == "reschedule" else []
    for answer in ("n\n", ""):  # no, and no answer at all
        result = cli(action, "-c", db, "--task", "charge_card", *extra, answer=answer)
        refused(result, 1, "not confirmed: nothing was changed")
        held = "running: told to stop" if action == "cancel" else "locked by a worker: skipped"
        assert (
            f"6 jobs match (task charge_card); 1 of them {held}. {action.capitalize()} them? [y/N]"
        ) in result.stderr
    assert snapshot(db) == before
    result = cli(action, "-c", db, "--queue", "mail", "--json", *extra, answer="y\n")
    assert json.loads(ok(result))["changed"] == [mixed["welcome"]]
    assert "1 job matches (queue mail)" in result.stderr
    nothing = cli(action, "-c", db, "--task", "nosuch", *extra)
    refused(nothing, 1, "no job matches (task nosuch): nothing was changed")
    assert nothing.stdout == ""


@pytest.mark.parametrize("action", ACTIONS)
def test_nothing_matched_exits_1_by_id_key_or_filter_alike(
    db: str, mixed: dict[str, int], action: str
) -> None:
    """No such job is exit code 1 and one line, whichever way the jobs were
    chosen (``retry 999`` exited 0 saying "Not found", ``retry --key nosuch``
    1); some found among ids is exit code 0, the missing ones listed."""
    before = snapshot(db)
    extra = ["--priority", "1"] if action == "reschedule" else []
    for args, text in (
        (["999999"], "no job has the id 999999: nothing was changed"),
        (["999998", "999999"], "no job has any of the ids 999998, 999999: nothing was changed"),
        (["--key", "nosuch"], "no job has the key 'nosuch': nothing was changed"),
        (["--state", "retrying", "--task", "nosuch", "-y"], "no job matches"),
    ):
        for json_flag in ([], ["--json"]):
            result = cli(action, "-c", db, *args, *json_flag, *extra)
            refused(result, 1, text)
            assert result.stdout == ""
    assert snapshot(db) == before
    some = ok(cli(action, "-c", db, str(mixed["waiting"]), "999999", *extra))
    assert some.splitlines()[-1] == "Not found: 999999"


# --- retry ----------------------------------------------------------------------


def test_retry_makes_jobs_runnable_and_keeps_their_error(db: str, mixed: dict[str, int]) -> None:
    failed_run_at = job(db, mixed["failed"])["run_at"]  # type: ignore[index]
    out = ok(cli("retry", "-c", db, str(mixed["failed"]), str(mixed["scheduled"]), "999999"))
    assert out.splitlines() == [
        f"Retried 2 jobs: {mixed['failed']}, {mixed['scheduled']}",
        "Not found: 999999",
    ]
    failed = job(db, mixed["failed"])
    assert failed and failed["attempts"] == 0 and failed["max_attempts"] == 3
    assert failed["last_error"] == "card declined\n  at charge()" and failed["is_available"]
    assert failed["run_at"] == failed_run_at  # due already: keeps its place
    assert job(db, mixed["scheduled"])["due"]  # type: ignore[index]
    by_key = json.loads(ok(cli("retry", "-c", db, "--key", "later-1", "--json")))
    assert by_key["changed"] == [mixed["later"]] and by_key["counts"]["changed"] == 1
    later = job(db, mixed["later"])
    assert later and later["due"] and later["attempts"] == 0 and later["last_error"] == "timeout"


def test_retry_by_filter_and_locked_jobs_left_alone(db: str, mixed: dict[str, int]) -> None:
    locked_before = job(db, mixed["locked"])
    out = json.loads(ok(cli("retry", "-c", db, "--state", "running", "--yes", "--json")))
    # A lock more than 4 hours old is a crashed worker's: changed, as
    # graphile-worker's reschedule_jobs does.
    assert out["changed"] == [mixed["stale"]] and out["locked"] == [mixed["locked"]]
    assert job(db, mixed["locked"]) == locked_before
    text = ok(cli("retry", "-c", db, str(mixed["locked"])))
    assert f"Skipped 1 job locked by a worker (left alone): {mixed['locked']}" in text
    out = json.loads(ok(cli("retry", "-c", db, "--task", "charge_card", "--state",
                            "retrying", "-y", "--json")))  # fmt: skip
    assert out["changed"] == [mixed["retrying"]]
    assert job(db, mixed["retrying"])["attempts"] == 0  # type: ignore[index]


# --- reschedule -----------------------------------------------------------------


def test_reschedule_sets_the_fields_given(db: str, mixed: dict[str, int]) -> None:
    ok(cli("reschedule", "-c", db, str(mixed["waiting"]), "--at", "2031-02-03T04:05:06+01:00",
           "--priority", "-5", "--max-attempts", "7", "--attempts", "2"))  # fmt: skip
    moved = job(db, mixed["waiting"])
    assert moved and moved["run_at"].isoformat() == "2031-02-03T03:05:06+00:00"
    assert (moved["priority"], moved["max_attempts"], moved["attempts"]) == (-5, 7, 2)
    out = json.loads(ok(cli("reschedule", "-c", db, "--key", "welcome-7", "--in", "2h", "--json")))
    assert out["changed"] == [mixed["welcome"]]
    assert value(db, f"select run_at - now() between '119m' and '121m' from {JOBS} where id = %s",
                 (mixed["welcome"],))  # fmt: skip
    ok(cli("reschedule", "-c", db, "--task", "email", "--priority", "9", "--yes"))
    assert value(db, "select array_agg(distinct priority) from graphile_worker.jobs "
                 "where task_identifier = 'email'") == [9]  # fmt: skip
    assert job(db, mixed["welcome"])["max_attempts"] == 25  # type: ignore[index]


def test_reschedule_refuses_bad_input(db: str, mixed: dict[str, int]) -> None:
    before = snapshot(db)
    one = str(mixed["waiting"])
    refused(cli("reschedule", "-c", db, one), 2, "give what to change")
    refused(cli("reschedule", "-c", db, one, "--at", "2031-01-01T00:00:00+00:00", "--in", "1h"),
            2, "--at or --in, not both")  # fmt: skip
    refused(cli("reschedule", "-c", db, one, "--at", "2031-01-01T00:00:00"), 2, "no time zone")
    refused(cli("reschedule", "-c", db, one, "--at", "tomorrow"), 2, "not an ISO 8601")
    refused(cli("reschedule", "-c", db, one, "--in", "soon"), 2, "not a length")
    refused(cli("reschedule", "-c", db, one, "--in", "400d"), 2, "at most 366 days")
    refused(cli("reschedule", "-c", db, one, "--priority", "40000"), 2, "--priority")
    refused(cli("reschedule", "-c", db, one, "--max-attempts", "0"), 2, "--max-attempts")
    refused(cli("reschedule", "-c", db, one, "--attempts", "-1"), 2, "--attempts")
    assert snapshot(db) == before


# --- fail -----------------------------------------------------------------------


def test_fail_keeps_the_last_real_error(db: str, mixed: dict[str, int]) -> None:
    out = ok(cli("fail", "-c", db, str(mixed["retrying"]), str(mixed["waiting"]),
                 str(mixed["failed"]), str(mixed["locked"]), "--reason", "bad card"))  # fmt: skip
    assert out.splitlines() == [
        f"Permanently failed 2 jobs: {mixed['retrying']}, {mixed['waiting']}",
        f"Skipped 1 job locked by a worker (left alone): {mixed['locked']}",
        f"Left 1 job as they were (already permanently failed): {mixed['failed']}",
    ]
    retrying = job(db, mixed["retrying"])
    assert retrying and retrying["last_error"] == "bad card (was: boom)"
    assert retrying["attempts"] == retrying["max_attempts"]
    assert job(db, mixed["waiting"])["last_error"] == "bad card"  # type: ignore[index]
    # Already failed: its error is not wrapped again.
    assert job(db, mixed["failed"])["last_error"] == "card declined\n  at charge()"  # type: ignore[index]
    assert job(db, mixed["locked"])["attempts"] == 1  # type: ignore[index]
    # Retried, then failed again: the original error is still there.
    ok(cli("retry", "-c", db, str(mixed["retrying"])))
    ok(cli("fail", "-c", db, str(mixed["retrying"])))
    assert job(db, mixed["retrying"])["last_error"] == (  # type: ignore[index]
        "permanently failed from the command line (was: bad card (was: boom))"
    )


def test_fail_by_filter_and_key_and_refuses_an_empty_reason(db: str, mixed: dict[str, int]) -> None:
    refused(cli("fail", "-c", db, str(mixed["waiting"]), "--reason", " "), 2, "must not be empty")
    out = json.loads(ok(cli("fail", "-c", db, "--key", "later-1", "--json")))
    assert out["changed"] == [mixed["later"]]
    out = json.loads(ok(cli("fail", "-c", db, "--state", "waiting", "--yes", "--json")))
    assert sorted(out["changed"]) == sorted([mixed["waiting"], mixed["welcome"]])
    assert listed(db, "--state", "waiting") == []


# --- remove ---------------------------------------------------------------------


def test_remove_by_ids_filter_and_key(db: str, mixed: dict[str, int]) -> None:
    out = ok(cli("remove", "-c", db, str(mixed["waiting"]), str(mixed["locked"])))
    assert out.splitlines() == [
        f"Removed 1 job: {mixed['waiting']}",
        f"Skipped 1 job locked by a worker (left alone): {mixed['locked']}",
    ]
    assert job(db, mixed["waiting"]) is None and job(db, mixed["locked"]) is not None
    out = json.loads(ok(cli("remove", "-c", db, "--state", "failed", "-y", "--json")))
    assert out["changed"] == [mixed["failed"]] and job(db, mixed["failed"]) is None
    assert ok(cli("remove", "-c", db, "--key", "welcome-7")).strip() == (
        f"Removed 1 job: {mixed['welcome']}"
    )
    assert job(db, mixed["welcome"]) is None


def test_remove_by_key_of_a_running_job_is_remove_job(db: str, mixed: dict[str, int]) -> None:
    set_job(db, mixed["locked"], "key = 'running-1'")
    out = json.loads(ok(cli("remove", "-c", db, "--key", "running-1", "--json")))
    assert out["stopped"] == [mixed["locked"]] and out["changed"] == []
    running = job(db, mixed["locked"])
    assert running and running["key"] is None and running["attempts"] == running["max_attempts"]
    assert running["locked_by"] == "pool-live"
    set_job(db, mixed["stale"], "key = 'running-2'")
    set_job(db, mixed["scheduled"], "key = 'running-3'")
    set_job(db, mixed["scheduled"], "locked_at = now(), locked_by = 'pool-live'")
    text = ok(cli("remove", "-c", db, "--key", "running-3"))
    assert "keeps running, but lost its key and will not be retried" in text


def test_remove_releases_the_uniqueness_lock(db: str) -> None:
    unique = (
        "select job_id, conflict from graphile_worker.py_add_job("
        "'u', '{}', unique_rule => '{\"period\": 600}')"
    )
    [first] = rows(db, unique)
    assert rows(db, unique)[0]["conflict"] is True
    ok(cli("remove", "-c", db, str(first["job_id"])))
    assert rows(db, unique)[0]["conflict"] is False


# --- cancel ---------------------------------------------------------------------


def history_state(db: str, job_id: int) -> str | None:
    found = rows(db, "select state, cancel_reason from graphile_worker._private_py_job_history "
                 "where job_id = %s", (job_id,))  # fmt: skip
    return f"{found[0]['state']} ({found[0]['cancel_reason']})" if found else None


def test_cancel_by_ids_key_and_filters_as_the_other_actions(db: str, mixed: dict[str, int]) -> None:
    out = ok(cli("cancel", "-c", db, str(mixed["waiting"]), str(mixed["locked"]), "999999"))
    assert out.splitlines() == [
        f"Cancelled 1 job: {mixed['waiting']}",
        "Not found: 999999",
        f"Told 1 running job to stop (recorded as cancelled when it ends): {mixed['locked']}",
    ]
    assert job(db, mixed["waiting"]) is None and history_state(db, mixed["waiting"]) == (
        "cancelled (None)"
    )
    locked = job(db, mixed["locked"])
    assert locked and locked["attempts"] == locked["max_attempts"]  # never retried
    again = ok(cli("cancel", "-c", db, str(mixed["waiting"])))
    assert (
        again.splitlines()[-1] == f"Left 1 job as they were (finished already): {mixed['waiting']}"
    )
    by_key = json.loads(
        ok(cli("cancel", "-c", db, "--key", "welcome-7", "--json", "--reason", "k"))
    )
    assert by_key["changed"] == [mixed["welcome"]]
    assert history_state(db, mixed["welcome"]) == "cancelled (k)"
    by_filter = cli("cancel", "-c", db, "--task", "charge_card", "--state", "scheduled", "-y")
    assert ok(by_filter).strip() == f"Cancelled 1 job: {mixed['scheduled']}"
    refused(cli("cancel", "-c", db, "--key", "later-1", "--task", "email"), 2, "only one")
    assert job(db, mixed["later"]) is not None


# --- batches --------------------------------------------------------------------


@pytest.mark.parametrize("action", ["retry", "reschedule", "fail", "remove", "cancel"])
def test_a_large_filter_is_done_in_batches(db: str, action: str) -> None:
    rows(db, "select graphile_worker.add_job('bulk', json_build_object('n', g), max_attempts => 5)"
             " from generate_series(1, 2500) as g")  # fmt: skip
    rows(db, f"update {JOBS} set attempts = 1, last_error = 'e' || id")
    held = [row["id"] for row in rows(db, f"select id from {JOBS} order by id offset 1200 limit 3")]
    rows(db, f"update {JOBS} set locked_at = now(), locked_by = 'w' where id = any(%s)", (held,))
    extra = ["--priority", "3"] if action == "reschedule" else []
    out = json.loads(ok(cli(action, "-c", db, "--task", "bulk", "--yes", "--json", *extra)))
    held_as = "stopped" if action == "cancel" else "locked"  # cancel tells them to stop
    assert out["counts"] == {
        "changed": 2497,
        "locked": 0,
        "missing": 0,
        "unchanged": 0,
        "stopped": 0,
    } | {held_as: 3}
    assert out[held_as] == held
    left = rows(db, f"select id, attempts, priority, last_error, xmin::text as tx from {JOBS} "
                "where locked_at is null order by id")  # fmt: skip
    if action in ("remove", "cancel"):
        assert left == []
        return
    assert len(left) == 2497
    if action == "retry":
        assert {row["attempts"] for row in left} == {0}
    if action == "reschedule":
        assert {row["priority"] for row in left} == {3}
    if action == "fail":
        reason = "permanently failed from the command line"
        assert all(row["last_error"] == f"{reason} (was: e{row['id']})" for row in left)
    # 1,000 ids a transaction: three of them.
    assert len({row["tx"] for row in left}) == 3


def test_a_job_added_after_the_count_is_left_alone(db: str) -> None:
    first = add(db, "bulk")
    process = subprocess.Popen(
        [cli_path(), "fail", "-c", db, "--task", "bulk"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None and process.stdin is not None
    prompt = ""
    while not prompt.endswith("[y/N]: "):
        prompt += process.stderr.read(1)
    assert prompt.startswith("1 job matches (task bulk)")
    later = add(db, "bulk")
    out, _ = process.communicate("y\n", timeout=60)
    assert process.returncode == 0 and out.strip() == f"Permanently failed 1 job: {first}"
    assert job(db, later)["attempts"] == 0  # type: ignore[index]


# --- migrate --------------------------------------------------------------------


def test_migrate_installs_then_reports_and_json(empty_db: str) -> None:
    assert "migrated to revision 20" in ok(cli("migrate", "-c", empty_db))
    assert ok(cli("-c", empty_db, "migrate")).strip() == (
        "Schema 'graphile_worker' is up to date (revision 20)."
    )
    report = json.loads(ok(cli("migrate", "-c", empty_db, "--json", "-s", "other")))
    assert report["schema"] == "other" and report["revision"] == 20
    assert report["previous_revision"] is None and report["applied"]
    again = json.loads(ok(cli("migrate", "-c", empty_db, "--json", "-s", "other")))
    assert again["applied"] == [] and again["applied_py"] == [] and again["previous_revision"] == 20
    refused(cli("migrate", "-c", empty_db, "-s", ""), 2, "must not be empty")
    refused(cli("migrate", "-c", empty_db, "--yes"), 2, "No such option '--yes'")
