"""The chaos test's poison phase (tests/system/test_chaos.py): jobs of every kind that
once stalled a worker, mixed into innocent ones, while the surviving workers
run.

Each kind is a task of its own (or a row the worker cannot read); each job of
a kind ends in a known state, which :func:`check_poison` checks: a failure
recorded with a clear ``last_error`` and nothing locked, or a success. The
innocent jobs of the phase are chaos jobs: the run checks apply to them, and
each must run exactly once (no fault is injected during the phase).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos import Db

# Tasks that misbehave, in the chaos worker's tasks folder.
POISON_TASKS = {
    # A batch whose stored payload Python reads as inf (1e400): the failed
    # item goes back as it was stored.
    "poison_batch": """\
async def task(payload, helpers):
    return [ValueError("item") if isinstance(item, float) else None for item in payload]
""",
    # Its failure is refused by a trigger (see REFUSE_TRIGGER).
    "poison_refused": """\
async def task(payload, helpers):
    raise ValueError("poison-pill")
""",
    # An async task raising CancelledError (it awaited a cancelled sub-task).
    "poison_cancel": """\
import asyncio


async def task(payload, helpers):
    sub = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_soon(sub.cancel)
    await sub
""",
    # A plain task that forks; the child exits with sys.exit().
    "poison_fork": """\
import os, sys


def task(payload, helpers):
    pid = os.fork()
    if pid == 0:
        sys.exit(3)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 3:
        raise RuntimeError(f"the child ended with {status}")
""",
    # A plain task returning a coroutine, which must be awaited.
    "poison_coroutine": """\
import asyncio


async def later():
    await asyncio.sleep(0.01)
    raise ValueError("raised by the returned coroutine")


def task(payload, helpers):
    return later()
""",
    # An async task that leaves a thread running (not a daemon thread).
    "poison_thread": """\
import threading


async def task(payload, helpers):
    threading.Thread(target=threading.Event().wait, name="left-by-poison").start()
""",
    # An async task that blocks the event loop.
    "poison_blocker": """\
import time


async def task(payload, helpers):
    time.sleep(1.2)
""",
    # What runs on a job's behalf after its task (issue 41): a Snooze that
    # skipped its __init__, results whose encoding raises SystemExit (async and
    # plain), a cancel reason psycopg cannot send, a retry policy whose
    # retry_on raises KeyboardInterrupt, an error whose str() raises MemoryError.
    "poison_snooze": """\
from worker_cli import Snooze


class NoInit(Snooze):
    def __init__(self):
        pass


async def task(payload, helpers):
    raise NoInit()
""",
    "poison_result": """\
class ItemsRaise(dict):
    def items(self):
        raise SystemExit(3)


async def task(payload, helpers):
    return ItemsRaise(a=1)
""",
    "poison_plain_result": """\
class ItemsRaise(dict):
    def items(self):
        raise SystemExit(3)


def task(payload, helpers):
    return ItemsRaise(a=1)
""",
    "poison_reason": """\
from worker_cli import Cancel


async def task(payload, helpers):
    raise Cancel(ValueError("nul \\x00 and lone \\ud800"))
""",
    "poison_retry_on": """\
from worker_cli import RetryPolicy, task_options


class Meta(type):
    def __instancecheck__(cls, instance):
        raise KeyboardInterrupt


class Never(Exception, metaclass=Meta):
    pass


@task_options(retry=RetryPolicy(retry_on=(Never,)))
async def task(payload, helpers):
    raise ValueError("flaky")
""",
    "poison_str": """\
class Unprintable(Exception):
    def __str__(self):
        raise MemoryError


def task(payload, helpers):
    raise Unprintable()
""",
    # The blocking form of helpers.limit on the event loop's own thread.
    "poison_sync_limit": """\
async def task(payload, helpers):
    with helpers.limit("poison-op"):
        pass
""",
    # A task limited per value of "k" (LIMITS below); its k is 5,000 characters.
    "poison_long_key": """\
async def task(payload, helpers):
    pass
""",
    # Session settings that would break the next statements on the connection.
    "poison_sets": """\
async def task(payload, helpers):
    await helpers.query("set statement_timeout = 1")
    await helpers.query("set session characteristics as transaction read only")
""",
}

#: The limits the poison tasks need, set before their jobs are added.
LIMITS = (
    "select graphile_worker.py_set_limit('operation', 'poison-op', max_running => 10)",
    "select graphile_worker.py_set_limit('task', 'poison_long_key', max_running => 2,"
    " partition_by => 'k')",
)

REFUSE_TRIGGER = """
create function public.refuse_poison() returns trigger language plpgsql as $$
begin
  if new.last_error like '%poison-pill%' then
    raise exception 'this error message is refused';
  end if;
  return new;
end $$;
create trigger refuse_poison before update on graphile_worker._private_jobs
for each row execute function public.refuse_poison();
"""


@dataclass(frozen=True)
class Poison:
    """One kind of poison job: how it is added, and the state it must end in
    (``gone``: it succeeded; else its row holds ``last_error`` starting with
    ``error`` and, when given, ``payload``)."""

    kind: str
    add: str  # the arguments of graphile_worker.add_job
    gone: bool = False
    error: str = ""
    payload: str | None = None


_BATCH_ERROR = "RuntimeError: Batch failures (1 of 2 items)"
_REFUSED_ERROR = "the worker could not record this job's failure"
_DEEP = "(repeat('[', 12000) || repeat(']', 12000))::json"  # see test_poison.py
_DIGITS = "('[' || repeat('7', 5000) || ']')::json"
POISONS = (
    Poison("batch", "'poison_batch', '[1e400, 2]'::json", error=_BATCH_ERROR, payload="[1e400]"),
    Poison("refused", "'poison_refused', '{}'::json", error=_REFUSED_ERROR),
    Poison("deep", f"'chaos', {_DEEP}", error="UnreadableJobError: payload"),
    Poison("digits", f"'chaos', {_DIGITS}", error="UnreadableJobError: payload"),
    Poison("cancel", "'poison_cancel', '{}'::json", error="CancelledError"),
    Poison("fork", "'poison_fork', '{}'::json", gone=True),
    Poison("coroutine", "'poison_coroutine', '{}'::json", error="ValueError: raised by the"),
    Poison("thread", "'poison_thread', '{}'::json", gone=True),
    Poison("blocker", "'poison_blocker', '{}'::json", gone=True),
    Poison("snooze", "'poison_snooze', '{}'::json", error="NoInit; then the worker could not"),
    Poison("result", "'poison_result', '{}'::json", gone=True),
    Poison("plain_result", "'poison_plain_result', '{}'::json", gone=True),
    Poison("reason", "'poison_reason', '{}'::json", gone=True),  # cancelled
    Poison("retry_on", "'poison_retry_on', '{}'::json", error="ValueError: flaky; then"),
    Poison(
        "str", "'poison_str', '{}'::json", error="Unprintable: <unprintable Unprintable object>"
    ),
    Poison("sync_limit", "'poison_sync_limit', '{}'::json", error="RuntimeError: helpers.limit"),
    Poison("long_key", "'poison_long_key', json_build_object('k', repeat('k', 5000))", gone=True),
    Poison("sets", "'poison_sets', '{}'::json", gone=True),
)


def write_poison_tasks(folder: Path) -> None:
    for name, source in POISON_TASKS.items():
        (folder / "tasks" / f"{name}.py").write_text(source)


def add_poison(db: Db, copies: int) -> dict[int, Poison]:
    """``copies`` jobs of each kind (failed for good at their first failure)."""
    for limit in LIMITS:
        db.value(limit)
    added: dict[int, Poison] = {}
    for _ in range(copies):
        for poison in POISONS:
            job_id = db.value(
                f"select id from graphile_worker.add_job({poison.add}, max_attempts := 1)"
            )
            added[int(job_id)] = poison
    return added


def add_innocent_early_job(db: Db) -> int:
    """A chaos job due at -infinity (before any Python datetime): it must run."""
    job_id = db.value(
        "select id from graphile_worker.add_job('chaos', '{\"sleep\": 0.01, \"queue\": null}', "
        "run_at := '-infinity')"
    )
    return int(job_id)


def poison_settled(db: Db, poisons: dict[int, Poison]) -> bool:
    """Every poison job has reached its end (gone, or failed and unlocked)."""
    rows = db.rows(
        "select id from graphile_worker._private_jobs where id = any(%s) "
        "and (locked_by is not null or attempts < max_attempts)",
        (list(poisons),),
    )
    gone = {job for job, poison in poisons.items() if poison.gone}
    left = {
        row["id"]
        for row in db.rows(
            "select id from graphile_worker._private_jobs where id = any(%s)", (list(gone),)
        )
    }
    return not rows and not left


def check_poison(db: Db, poisons: dict[int, Poison]) -> list[str]:
    """What is wrong with the poison jobs' end states (empty: all as expected)."""
    rows: dict[int, dict[str, Any]] = {
        row["id"]: row
        for row in db.rows(
            "select id, payload::text as payload, last_error, locked_by, attempts, max_attempts "
            "from graphile_worker._private_jobs where id = any(%s)",
            (list(poisons),),
        )
    }
    problems = []
    for job, poison in sorted(poisons.items()):
        row = rows.get(job)
        if poison.gone:
            if row is not None:
                problems.append(f"{poison.kind} job {job} should have succeeded: {row}")
            continue
        if row is None:
            problems.append(f"{poison.kind} job {job} is gone; it should have failed")
            continue
        if row["locked_by"] is not None or row["attempts"] != row["max_attempts"]:
            problems.append(f"{poison.kind} job {job} is not failed for good: {row}")
        if not (row["last_error"] or "").startswith(poison.error):
            problems.append(f"{poison.kind} job {job}: last_error {row['last_error']!r}")
        if poison.payload is not None and row["payload"] != poison.payload:
            problems.append(f"{poison.kind} job {job}: payload {row['payload']!r}")
    return problems
