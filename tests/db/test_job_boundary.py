"""Fault injection at every seam where a worker runs code on a job's behalf.

One bad job fails alone (issue 41): for each per-job hook the worker has (the
task itself, async, plain and in a worker process; its returned value's encoding; its batch
results; the Snooze or Cancel it raises and their values; its retry policy's
``retry_on`` and backoff; the text of its error; the payload's type; the
event handlers and logging filters that see its outcome), a job makes that
hook raise each of Exception, SystemExit, KeyboardInterrupt, a CancelledError
nobody asked for and MemoryError, or hand the worker a value it cannot store.
All of them run in one worker process beside innocent jobs; then:

- every innocent job ran exactly once, and its row is gone;
- every bad job ended as its hook implies (failed with an error that says
  what happened, succeeded without its result, cancelled with its reason as
  text), and none is left locked;
- SIGTERM stops the worker within its graceful timeout, exit status 0.

The same jobs (but process tasks) through ``worker_cli.testing.run_jobs``,
which runs the worker's per-job code on one connection, one job at a time:
each ends the same way, and ``run_jobs`` returns.

A hook added later (workflows, progress, job logs) joins HOOKS and EXPECTED.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import rows, value
from fault_helpers import Worker, started_worker, wait_until

pytestmark = pytest.mark.db

KINDS = ("Exception", "SystemExit", "KeyboardInterrupt", "CancelledError", "MemoryError")

#: The tasks, one per hook; ``payload["kind"]`` says what to raise (KINDS), or
#: ``payload["value"]`` what value to hand the worker.
HOOKS = '''\
import asyncio
import dataclasses
import logging
import math
import os
import threading

from worker_cli import Cancel, RetryPolicy, Snooze, task_options


def boom(kind):
    return {
        "Exception": lambda: ValueError("hook raised"),
        "SystemExit": lambda: SystemExit(3),
        "KeyboardInterrupt": lambda: KeyboardInterrupt(),
        "CancelledError": lambda: asyncio.CancelledError(),
        "MemoryError": lambda: MemoryError(),
    }[kind]()


class Raises:
    """Raises payload["kind"] wherever one of its hooks is used."""

    def __init__(self, kind):
        self.kind = kind


class ItemsRaise(dict):
    def __init__(self, kind):
        super().__init__(a=1)
        self.kind = kind

    def items(self):
        raise boom(self.kind)


class LenRaises(list):
    def __init__(self, kind):
        super().__init__([None])
        self.kind = kind

    def __len__(self):
        raise boom(self.kind)


class BadSnooze(Snooze):
    def __init__(self, kind=None, value=None):
        self.kind, self.value = kind, value

    @property
    def seconds(self):
        if self.kind is not None:
            raise boom(self.kind)
        return self.value


class BadCancel(Cancel):
    def __init__(self, kind):
        self.kind = kind

    @property
    def reason(self):
        raise boom(self.kind)


class StrRaises(Exception):
    def __init__(self, kind):
        self.kind = kind

    def __str__(self):
        raise boom(self.kind)


class Meta(type):
    kind = "Exception"

    def __instancecheck__(cls, instance):
        raise boom(Meta.kind)


class NeverMatches(Exception, metaclass=Meta):
    pass


async def task_async(payload, helpers):
    raise boom(payload["kind"])


def task_plain(payload, helpers):
    raise boom(payload["kind"])


@task_options(process=True)
def task_process(payload, helpers):
    if payload.get("value") == "exit":
        os._exit(3)
    raise boom(payload["kind"])


async def result_async(payload, helpers):
    if "value" in payload:
        return {"set": {1, 2}, "nan": math.nan}[payload["value"]]
    return ItemsRaise(payload["kind"])


def result_plain(payload, helpers):
    return ItemsRaise(payload["kind"])


@task_options(process=True)
def result_process(payload, helpers):
    if "value" in payload:
        return {"set": {1, 2}, "lock": threading.Lock()}[payload["value"]]
    return ItemsRaise(payload["kind"])


async def batch(payload, helpers):
    return LenRaises(payload[0]["kind"])


async def batch_items(payload, helpers):
    # one item fails with an error whose text holds NUL and a lone surrogate
    return [None, ValueError("item \\x00 \\ud800")]


async def snooze(payload, helpers):
    if "value" in payload:
        raise BadSnooze(value={"text": "soon", "nan": math.nan, "huge": 1e300}[payload["value"]])
    raise BadSnooze(kind=payload["kind"])


async def cancel(payload, helpers):
    if "value" in payload:
        raise Cancel(
            {"exception": ValueError("why"), "object": object(), "nul": "a\\x00b"}[payload["value"]]
        )
    raise BadCancel(payload["kind"])


def backoff_of(job, error):
    if "value" in job.payload:
        return {"nan": math.nan, "text": "soon", "negative": -5}[job.payload["value"]]
    raise boom(job.payload["kind"])


@task_options(retry=RetryPolicy(backoff=backoff_of))
async def backoff(payload, helpers):
    raise ValueError("flaky")


@task_options(retry=RetryPolicy(retry_on=(NeverMatches,)))
async def retry_on(payload, helpers):
    Meta.kind = payload["kind"]
    raise ValueError("flaky")


async def error_text(payload, helpers):
    if "value" in payload:
        raise ValueError("nul \\x00 lone \\ud800 " + "x" * 200_000)
    raise StrRaises(payload["kind"])


@dataclasses.dataclass
class Order:
    kind: str

    def __post_init__(self):
        raise boom(self.kind)


async def typed(payload: Order, helpers):
    return None


async def events(payload, helpers):
    return None


def plain_events(payload, helpers):
    return None


#: The kind each "logged" job's outcome line raises (set by the job itself).
LOGGED = {}


async def logged(payload, helpers):
    LOGGED[helpers.job.id] = payload["kind"]


def plain_logged(payload, helpers):  # fails: its failure line raises
    LOGGED[helpers.job.id] = payload["kind"]
    raise ValueError("logged")


async def limit_key(payload, helpers):
    # An operation limit's partition: 5,000 characters, a NUL, a lone surrogate.
    partition = {"long": "x" * 5000, "nul": "a\\x00b", "surrogate": "a\\ud800b"}[payload["value"]]
    async with helpers.limit("op", partition=partition):
        pass


async def limited(payload, helpers):
    # A task limited per value of "k" (set by the test): k is 5,000 characters.
    return None


async def sync_limit(payload, helpers):
    # The blocking form on the event loop's own thread.
    with helpers.limit("op"):
        pass


async def sync_run(payload, helpers):
    helpers.run(asyncio.sleep(0))


async def sets(payload, helpers):
    # Session settings that would break the next jobs' statements on this connection.
    await helpers.query("set statement_timeout = 1")
    await helpers.query("set session characteristics as transaction read only")


class ShownRaises:
    """A log message whose text raises payload["kind"]."""

    def __init__(self, kind):
        self.kind = kind

    def __str__(self):
        raise boom(self.kind)


async def job_log(payload, helpers):
    # The attempt's kept lines (issue 46) and the worker's output both read it.
    helpers.logger.info(ShownRaises(payload["kind"]))
    raise ValueError("logged then failed")


async def progress(payload, helpers):
    if payload["value"] == "nul":
        helpers.progress(0.5, message="a\\x00b \\ud800 " + "x" * 5000)
        return None
    helpers.progress({"nan": math.nan, "huge": 10**400, "over": 2}[payload["value"]])


@task_options(process=True)
def progress_process(payload, helpers):
    if payload["value"] == "nul":
        helpers.progress(0.5, message="a\\x00b \\ud800 " + "x" * 5000)
        return None
    helpers.progress({"nan": math.nan, "huge": 10**400, "over": 2}[payload["value"]])


async def innocent(payload, helpers):
    await helpers.query("insert into public.innocent_runs values (%s)", (payload["n"],))


TASKS = {
    name: globals()[name]
    for name in (
        "task_async", "task_plain", "task_process", "result_async", "result_plain",
        "result_process", "batch", "batch_items",
        "snooze", "cancel", "backoff", "retry_on", "error_text", "events", "plain_events",
        "logged", "plain_logged", "limit_key", "limited", "sync_limit", "sync_run", "sets",
        "job_log", "progress", "progress_process", "innocent",
    )
}


def on_event(event):
    job = event.get("job")
    if job is not None and job.task_identifier in ("events", "plain_events"):
        raise boom(job.payload["kind"])


async def on_event_async(event):
    on_event(event)


class RaisingFilter(logging.Filter):
    """Raises, for the outcome lines of the "logged" jobs."""

    def filter(self, record):
        kind = LOGGED.get(getattr(record, "job_id", None))
        if kind is not None:
            raise boom(kind)
        return True
'''

WORKER = """\
import asyncio, logging, sys

sys.path.insert(0, ".")
import hooks
from worker_cli import run
from worker_cli.observe.events import Events


async def main():
    events = Events()
    for name in ("job:start", "job:success", "job:error", "job:failed", "job:complete"):
        events.on(name, hooks.on_event)
        events.on(name, hooks.on_event_async)
    logging.basicConfig(level=logging.INFO)  # the success lines too
    logging.getLogger("graphile_worker.worker").addFilter(hooks.RaisingFilter())
    tasks = dict(hooks.TASKS, typed=hooks.typed)  # its payload type, from its annotation
    runner = await run(
        sys.argv[1], task_list=tasks, concurrency=6, events=events, log_success=True,
        graceful_shutdown_timeout=5,
    )
    await runner


if __name__ == "__main__":  # not in the worker's processes, which import this file
    asyncio.run(main())
"""

#: What each bad job must end as: ("failed", text in last_error),
#: ("retrying", text in last_error: failed once, attempts left),
#: ("succeeded", text in result_error or None), ("cancelled", cancel_reason).
Expected = tuple[str, str | None]


def raised(kind: str) -> str:
    """How an exception of ``kind`` raised by a hook reads in last_error."""
    return {
        "Exception": "ValueError: hook raised",
        "SystemExit": "SystemExit: 3",
        "KeyboardInterrupt": "KeyboardInterrupt",
        "CancelledError": "CancelledError",
        "MemoryError": "MemoryError",
    }[kind]


def expected_of(task: str, payload: dict[str, Any]) -> Expected:
    kind = payload.get("kind", "")
    value_ = payload.get("value")
    match task, value_:
        case "task_async" | "task_plain" | "task_process", None:
            return "failed", raised(kind)
        case "task_process", "exit":
            return "failed", "running the job exited with code 3"
        case "result_async" | "result_plain", None:
            return "succeeded", f"not JSON: {raised(kind)}"
        case "result_process", None:
            # Its value is pickled in its process (dict items read there): that fails.
            return "failed", f"(process=True: it must be picklable): {raised(kind)}"
        case "result_process", "lock":
            return "failed", "TypeError: the task's return value cannot be sent back from its"
        case "result_async" | "result_process", "set":
            return "succeeded", "not JSON: TypeError: Object of type set"
        case "result_async", "nan":
            return "succeeded", "not JSON: ValueError: Out of range float"
        case "batch", None:
            return "failed", f"the worker could not read its batch results: {raised(kind)}"
        case "batch_items", None:
            return "failed", "Batch failures (1 of 2 items):\nValueError: item \\x00 \\ud800"
        case "snooze", None:
            return "failed", f"could not act on the BadSnooze it raised: {raised(kind)}"
        case "snooze", _:
            return "failed", "could not act on the BadSnooze it raised: ValueError: Snooze: seconds"
        case "cancel", None:
            return "failed", f"could not act on the BadCancel it raised: {raised(kind)}"
        case "cancel", "exception":
            return "cancelled", "ValueError: why"
        case "cancel", "object":
            return "cancelled", "<object object at"
        case "cancel", "nul":
            return "cancelled", "a\\x00b"
        case "backoff", _:
            # The backoff's failure is logged; graphile-worker's backoff is used.
            return "retrying", "ValueError: flaky"
        case "retry_on", None:
            return "failed", f"could not apply its task's retry policy: {raised(kind)}"
        case "error_text", None:
            return "failed", "<unprintable StrRaises object>"
        case "error_text", _:
            return "failed", "ValueError: nul \\x00 lone \\ud800 xxx"
        case "typed", None:
            return "failed", raised(kind)
        case "plain_logged", None:
            return "failed", "ValueError: logged"
        case "events" | "plain_events" | "logged", None:
            return "succeeded", None
        case "limit_key" | "limited" | "sets", _:
            return "succeeded", None
        case "sync_limit", _:
            return "failed", "RuntimeError: helpers.limit: 'with helpers.limit(...)' waits"
        case "job_log", None:
            # The job logger's prefix reads the message: the task's own call
            # raises what its __str__ does, the job fails with it.
            return "failed", raised(kind)
        case "progress" | "progress_process", "nul":
            return "succeeded", None
        case "progress" | "progress_process", "over":
            return "failed", "ValueError: done is 2: without a total"
        case "progress" | "progress_process", _:
            return "failed", "ValueError: done is "
        case "sync_run", _:
            return "failed", "RuntimeError: helpers.run() waits for the worker's event loop"
    raise AssertionError(f"no expectation for {task} {payload}")


def bad_jobs() -> list[tuple[str, Any]]:
    """(task, payload) of every bad job."""
    jobs: list[tuple[str, Any]] = []
    for kind in KINDS:
        for task in (
            "task_async",
            "task_plain",
            "task_process",
            "result_async",
            "result_plain",
            "result_process",
            "snooze",
            "cancel",
            "backoff",
            "retry_on",
            "error_text",
            "typed",
            "events",
            "plain_events",
            "logged",
            "plain_logged",
            "job_log",
        ):
            jobs.append((task, {"kind": kind}))
        jobs.append(("batch", [{"kind": kind}]))
    for task, values in {
        "result_async": ("set", "nan"),
        "task_process": ("exit",),
        "result_process": ("set", "lock"),
        "snooze": ("text", "nan", "huge"),
        "cancel": ("exception", "object", "nul"),
        "backoff": ("nan", "text", "negative"),
        "error_text": ("long",),
        "limit_key": ("long", "nul", "surrogate"),
        "progress": ("nan", "huge", "over", "nul"),
        "progress_process": ("nan", "huge", "over", "nul"),
    }.items():
        jobs.extend((task, {"value": v}) for v in values)
    jobs.append(("batch_items", [{}, {}]))
    jobs.append(("limited", {"k": "x" * 5000, "value": "long key"}))
    jobs.extend((task, {"value": "-"}) for task in ("sync_limit", "sync_run", "sets", "sets"))
    return jobs


def add_bad_and_innocent_jobs(
    db: str, tmp_path: Path, leave_out: frozenset[str] = frozenset()
) -> dict[int, tuple[str, Any]]:
    """The hooks module in ``tmp_path``, the limits the bad jobs use, a job
    for each bad job (but the tasks in ``leave_out``) and 60 innocent jobs;
    the bad ones by id."""
    (tmp_path / "hooks.py").write_text(HOOKS)
    rows(db, "create table public.innocent_runs (n int)")
    rows(db, "select graphile_worker.py_set_limit('operation', 'op', max_running => 50)")
    rows(
        db,
        "select graphile_worker.py_set_limit('task', 'limited', max_running => 5,"
        " partition_by => 'k')",
    )
    bad: dict[int, tuple[str, Any]] = {}
    for task, payload in bad_jobs():
        if task in leave_out:
            continue
        # One attempt each (its outcome is final), two for the backoff's
        # (the backoff runs only when another attempt follows).
        job_id = value(
            db,
            "select id from graphile_worker.add_job(%s, %s::json, max_attempts := %s)",
            (task, json.dumps(payload), 2 if task == "backoff" else 1),
        )
        bad[job_id] = (task, payload)
    rows(
        db,
        "select graphile_worker.add_job('innocent', json_build_object('n', n)) "
        "from generate_series(1, 60) as n",
    )
    return bad


def check_each_ended_alone(db: str, bad: dict[int, tuple[str, Any]]) -> None:
    """Every innocent job ran once; every bad job ended as its hook implies,
    unlocked, its failed attempts kept with a bounded traceback."""
    assert value(db, "select count(*) from public.innocent_runs") == 60
    assert value(db, "select count(distinct n) from public.innocent_runs") == 60
    # "later": retried after a backoff from its failure (updated_at), not
    # compared with now(): a first attempt's default backoff is about 2.7 s,
    # which a slow run of this test outlasts.
    live = {
        row["id"]: row
        for row in rows(
            db,
            "select id, attempts, max_attempts, last_error, locked_by, "
            "run_at > updated_at as later from graphile_worker._private_jobs",
        )
    }
    history = {
        row["job_id"]: row
        for row in rows(
            db,
            "select job_id, state, result_error, cancel_reason, last_error "
            "from graphile_worker._private_py_job_history",
        )
    }
    # A slow run may outlast a retrying job's backoff, and the job's second
    # (final) attempt runs: then it must have waited graphile-worker's first
    # backoff, exp(1) s, after its first failure (both times are now() of a
    # failure's transaction).
    gaps = {
        row["job_id"]: row["gap"]
        for row in rows(
            db,
            "select job_id, extract(epoch from max(failed_at) - min(failed_at))::float as gap "
            "from graphile_worker._private_py_job_errors "
            "where job_id = any(%s) group by job_id having count(*) = 2",
            (list(bad),),
        )
    }
    problems = []
    for job_id, (task, payload) in bad.items():
        state, text = expected_of(task, payload if isinstance(payload, dict) else payload[0])
        row, done = live.get(job_id), history.get(job_id)
        seen = row or done
        if state in ("failed", "retrying"):
            retried_after_backoff = (
                state == "retrying"
                and row is not None
                and row["attempts"] == 2
                and gaps.get(job_id, 0.0) >= math.exp(1) - 0.001
            )
            ok = (
                row is not None
                and row["locked_by"] is None
                and (row["attempts"] == 1 or retried_after_backoff)
                and (row["later"] if state == "retrying" else row["max_attempts"] == 1)
                and text is not None
                # a backoff's failure is logged, never stored: exactly the task's error
                and (
                    text == row["last_error"] if state == "retrying" else text in row["last_error"]
                )
            )
        elif state == "succeeded":
            ok = (
                row is None
                and done is not None
                and done["state"] == "succeeded"
                and (text is None or text in (done["result_error"] or ""))
            )
        else:
            ok = (
                row is None
                and done is not None
                and done["state"] == "cancelled"
                and text is not None
                and text in (done["cancel_reason"] or "")
            )
        if not ok:
            problems.append(f"job {job_id} {task} {payload}: expected {state} {text!r}, saw {seen}")
    assert not problems, "\n".join(problems)
    # Each failed attempt is kept with its traceback: bounded, storable, and
    # saying where the error came from (none for an error whose text cannot
    # be made, nor for one that was never raised).
    errors = {
        row["job_id"]: row
        for row in rows(
            db,
            "select job_id, error, traceback from graphile_worker._private_py_job_errors "
            "where job_id = any(%s)",
            (list(bad),),
        )
    }
    for job_id, (task, payload) in bad.items():
        state, _ = expected_of(task, payload if isinstance(payload, dict) else payload[0])
        if state not in ("failed", "retrying"):
            continue
        assert job_id in errors, f"job {job_id} {task} {payload}: no attempt error recorded"
        traceback = errors[job_id]["traceback"]
        if traceback is not None:
            assert len(traceback) <= 8_100 and "\x00" not in traceback, (task, payload)
        if (
            task in ("task_async", "task_plain", "task_process")
            and payload.get("kind") == "Exception"
        ):
            assert traceback is not None and "hook raised" in traceback, (task, traceback)
        if task == "error_text" and "value" in payload:
            assert traceback is not None and "characters cut" in traceback, traceback


def test_every_per_job_hook_fails_its_job_alone_and_the_worker_stops(
    db: str, tmp_path: Path
) -> None:
    bad = add_bad_and_innocent_jobs(db, tmp_path)
    (tmp_path / "worker.py").write_text(WORKER)
    worker = started_worker(db, Worker(db, tmp_path, command=[sys.executable, "worker.py", db]))

    def settled() -> bool:
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.log()[-4000:]}"
        return (
            value(
                db,
                "select count(*) from graphile_worker._private_jobs "
                "where locked_at is not null or attempts = 0",
            )
            == 0
        )

    wait_until(settled, 60, "every job to be attempted and none to be locked")
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0, worker.log()[-4000:]

    check_each_ended_alone(db, bad)


#: worker_cli.testing.run_jobs over the same jobs, in a process of its own
#: (a hook raising SystemExit or KeyboardInterrupt must not end it).
RUN_JOBS = """\
import logging, sys

sys.path.insert(0, ".")
import hooks
from worker_cli.testing import run_jobs

logging.basicConfig(level=logging.INFO)
logging.getLogger("graphile_worker.worker").addFilter(hooks.RaisingFilter())
ran = run_jobs(task_list=dict(hooks.TASKS, typed=hooks.typed), connection_string=sys.argv[1])
print("ran", len(ran))
"""

#: Tasks left out under run_jobs: it calls a process task in its own thread
#: (task_plain and result_plain stand for them), and one of them ends the process.
PROCESS_TASKS = frozenset({"task_process", "result_process", "progress_process"})


def test_every_per_job_hook_fails_its_job_alone_under_run_jobs(db: str, tmp_path: Path) -> None:
    """The testing helpers run the worker's per-job code on one connection,
    one job at a time: the same bad jobs fail alone there, and run_jobs
    returns."""
    bad = add_bad_and_innocent_jobs(db, tmp_path, leave_out=PROCESS_TASKS)
    (tmp_path / "run_jobs.py").write_text(RUN_JOBS)
    done = subprocess.run(
        [sys.executable, "run_jobs.py", db],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "ran " in done.stdout, (done.stdout + done.stderr)[-4000:]
    check_each_ended_alone(db, bad)
