"""Workflows across worker processes (issue 45, point 3): each step's job is
added once, whatever the races: two and three workers finishing the parents
of one child at the same moment, a worker killed (SIGKILL) while it runs
steps and writes their outcomes. Every run is recorded in public.step_runs by
the task itself (workflow, ref, job id; its end once it returns). The
workers run with ``--history off``: a step's result is then only in its
step's row, written with its success (the repair sweep, which would read it
from the history, cannot stand in for that)."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
from dbhelpers import rows, value
from fault_helpers import Worker, sigterm_all, started_worker, wait_until

pytestmark = [pytest.mark.db, pytest.mark.slow]

STEP_TASK = """\
import asyncio, os, random
async def task(payload, helpers):
    [run] = await helpers.query(
        "insert into public.step_runs (workflow_id, ref, job_id, pid) values (%s, %s, %s, %s) "
        "returning id",
        (helpers.workflow_id, helpers.step_ref, helpers.job.id, os.getpid()),
    )
    await asyncio.sleep(random.random() * payload.get("sleep", 0))
    await helpers.query(
        "update public.step_runs set finished = clock_timestamp() where id = %s", (run["id"],)
    )
    return sorted(helpers.parents)
"""

RUNS = """
  create table public.step_runs (
    id bigserial primary key, workflow_id bigint, ref text, job_id bigint, pid int,
    finished timestamptz
  )
"""


def add_workflows(db: str, diamonds: int, fan_in: int) -> int:
    """``diamonds`` workflows a -> (b, c) -> d, whose b and c end at about the
    same moment on different workers, and one of ``fan_in`` parents -> one
    child. Added through SQL (py_add_workflow), in one transaction."""
    diamond = (
        '[{"ref":"a","spec":{"identifier":"step"}},'
        '{"ref":"b","spec":{"identifier":"step","payload":{"sleep":0.02}},"after":["a"]},'
        '{"ref":"c","spec":{"identifier":"step","payload":{"sleep":0.02}},"after":["a"]},'
        '{"ref":"d","spec":{"identifier":"step"},"after":["b","c"]}]'
    )
    rows(
        db,
        "select graphile_worker.py_add_workflow('diamond', %s::jsonb) from generate_series(1, %s)",
        (diamond, diamonds),
    )
    parents = ",".join(
        f'{{"ref":"p{n}","spec":{{"identifier":"step","payload":{{"sleep":0.01}}}}}}'
        for n in range(fan_in)
    )
    after = ",".join(f'"p{n}"' for n in range(fan_in))
    fan = f'[{parents},{{"ref":"join","spec":{{"identifier":"step"}},"after":[{after}]}}]'
    rows(db, "select graphile_worker.py_add_workflow('fan-in', %s::jsonb)", (fan,))
    return diamonds * 4 + fan_in + 1


def check_each_step_ran_once(db: str, steps: int, fan_in: int, *, killed: bool = False) -> None:
    """Every workflow succeeded and each step had one job. Without kills each
    step finished once; with kills a run cut short (or finished by a worker
    killed before it wrote the success) runs again: the same job, at least once."""
    states = rows(
        db, "select state, count(*) from graphile_worker._private_py_workflows group by 1"
    )
    assert [r["state"] for r in states] == ["succeeded"], states
    finished = "count(*) filter (where finished is not null)"
    wrong = rows(
        db,
        f"select workflow_id, ref, count(distinct job_id) as jobs, {finished} as finished "
        "from public.step_runs group by 1, 2 "
        f"having count(distinct job_id) <> 1 or {finished} {'< 1' if killed else '<> 1'}",
    )
    assert wrong == [], wrong
    assert value(db, "select count(distinct (workflow_id, ref)) from public.step_runs") == steps
    joined = value(
        db,
        "select s.result from graphile_worker._private_py_workflow_steps s "
        "join graphile_worker._private_py_workflows w on w.id = s.workflow_id "
        "where w.name = 'fan-in' and s.ref = 'join'",
    )
    assert len(joined) == fan_in  # the join saw every parent
    # Each step's own result was recorded with its success (never lost
    # between a job's end and its children's start): its parents' refs.
    lost = value(
        db,
        """select count(*) from graphile_worker._private_py_workflow_steps as s
           where s.result is null or s.result::jsonb <> coalesce((
             select jsonb_agg(p.ref order by p.ref)
             from graphile_worker._private_py_workflow_edges as e
             join graphile_worker._private_py_workflow_steps as p on p.id = e.parent_id
             where e.child_id = s.id), '[]')""",
    )
    assert lost == 0
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


def wait_all_finished(db: str) -> None:
    wait_until(
        lambda: (
            value(
                db,
                "select count(*) from graphile_worker._private_py_workflows "
                "where state = 'running'",
            )
            == 0
        ),
        120,
        "every workflow to finish",
    )


def workers_folder(tmp_path: Path) -> Path:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "step.py").write_text(STEP_TASK)
    return tmp_path


@pytest.mark.parametrize("processes", [2, 3])
def test_each_step_starts_once_across_workers(db: str, tmp_path: Path, processes: int) -> None:
    rows(db, RUNS)
    cwd = workers_folder(tmp_path)
    workers = [
        started_worker(
            db, Worker(db, cwd, "-j", "10", "--poll-interval", "200", "--history", "off")
        )
        for _ in range(processes)
    ]
    steps = add_workflows(db, diamonds=150, fan_in=200)
    try:
        wait_all_finished(db)
    finally:
        assert sigterm_all(workers) == [0] * processes
    # Steps ran in more than one process (the races this is about).
    assert value(db, "select count(distinct pid) from public.step_runs") >= 2
    check_each_step_ran_once(db, steps, 200)


def test_each_step_starts_once_when_a_worker_is_killed(db: str, tmp_path: Path) -> None:
    rows(db, RUNS)
    cwd = workers_folder(tmp_path)
    steps = add_workflows(db, diamonds=300, fan_in=300)
    args = ("-j", "10", "--poll-interval", "200", "--history", "off")
    workers = [started_worker(db, Worker(db, cwd, *args)) for _ in range(3)]
    try:
        rng = random.Random(45)
        for _ in range(2):
            wait_until(
                lambda: (
                    value(db, "select count(*) from public.step_runs where finished is null") > 0
                ),
                60,
                "a step to be running",
                interval=0.01,
            )
            victim = workers.pop(rng.randrange(len(workers)))
            victim.signal(signal.SIGKILL)
            victim.wait()
            workers.append(started_worker(db, Worker(db, cwd, *args)))
        wait_all_finished(db)
    finally:
        assert sigterm_all(workers) == [0] * len(workers)
    check_each_step_ran_once(db, steps, 300, killed=True)


def test_each_step_starts_once_when_connections_are_cut(db: str, tmp_path: Path) -> None:
    """Every connection of two workers cut three times while they run steps
    and write their outcomes (pg_terminate_backend): a batch whose
    transaction was cut is written again whole, so each step still has one
    job and its result."""
    rows(db, RUNS)
    cwd = workers_folder(tmp_path)
    args = ("-j", "10", "--poll-interval", "200", "--history", "off")
    workers = [started_worker(db, Worker(db, cwd, *args)) for _ in range(2)]
    steps = add_workflows(db, diamonds=200, fan_in=300)
    try:
        for cut in range(3):
            wait_until(
                lambda cut=cut: (
                    value(db, "select count(*) from public.step_runs") > 150 * (cut + 1)
                ),
                60,
                "steps to run",
                interval=0.01,
            )
            assert value(
                db,
                "select count(pg_terminate_backend(pid)) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()",
            )
        wait_all_finished(db)
    finally:
        assert sigterm_all(workers) == [0, 0]
    check_each_step_ran_once(db, steps, 300, killed=True)
