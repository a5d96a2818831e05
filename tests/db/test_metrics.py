"""Prometheus metrics, scraped over HTTP: exact counts after known jobs, the
gauges, the queue depth (the states of `graphile-worker status`) and its cache."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dbhelpers import cli_path, rows, run_cli, value
from metrics_scrape import JOBS, Samples, sample, scrape, scrape_async, served
from workers import until, worker

from worker_cli import Helpers, Limit, WorkerUtils, task_options
from worker_cli.observe import queue_depth
from worker_cli.observe.status_report import read_status


def wait_until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {within}s waiting for {what}"
        time.sleep(0.05)


# --- The command line ---------------------------------------------------------

TASKS = {
    # async def: fails when asked; sleeps when asked.
    "alpha.py": (
        "import asyncio\n"
        "async def task(payload, helpers):\n"
        "    await asyncio.sleep(payload.get('sleep', 0))\n"
        "    if payload.get('fail'):\n"
        "        raise ValueError('alpha failed')\n"
    ),
    # a plain def, run in the slot's thread.
    "beta.py": (
        "def task(payload, helpers):\n"
        "    if payload.get('fail'):\n"
        "        raise ValueError('beta failed')\n"
    ),
}


@pytest.mark.db
def test_the_command_serves_exact_counts_of_the_jobs_it_ran(db: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, body in TASKS.items():
        (tasks / name).write_text(body)
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PG")}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [cli_path(), "-c", db, "--tasks", str(tasks), "-j", "4", "--metrics-port", "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "Serving Prometheus metrics at" in log.read_text(), 30, "the URL")
        url = log.read_text().split("Serving Prometheus metrics at ", 1)[1].split()[0]
        specs = [("alpha", {}), ("alpha", {"sleep": 0.3}), ("alpha", {}), ("alpha", {"fail": 1})]
        specs += [("beta", {}), ("beta", {}), ("beta", {"fail": 1}), ("beta", {"fail": 1})]
        for task, payload in specs:
            add = "select graphile_worker.add_job(%s, %s::json, max_attempts => 1)"
            rows(db, add, [task, json.dumps(payload)])
        # Done: successes deleted, failures (one attempt allowed) unlocked.
        done = f"select count(*) from {JOBS} where locked_at is not null or attempts = 0"
        wait_until(lambda: value(db, done) == 0, 30, "every job to run")
        samples = scrape(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()

    def jobs(task: str, outcome: str) -> float:
        return sample(samples, "graphile_worker_jobs_total", task=task, outcome=outcome)

    assert (jobs("alpha", "success"), jobs("alpha", "failure")) == (3, 1)
    assert (jobs("beta", "success"), jobs("beta", "failure")) == (2, 2)
    for task in ("alpha", "beta"):  # one attempt allowed: every failure is final
        assert [jobs(task, outcome) for outcome in ("retry", "cancelled", "timeout")] == [0] * 3
    for task in ("alpha", "beta"):
        name = "graphile_worker_job_duration_seconds"
        assert sample(samples, f"{name}_count", task=task) == 4
        assert sample(samples, f"{name}_bucket", task=task, le="+Inf") == 4
    # The 0.3 s job is above the 0.25 s bucket, and in the sum. (Not ">= 0.3":
    # uvloop's timers count whole milliseconds from a cached loop time, so
    # asyncio.sleep(0.3) may end a fraction of a millisecond early by the
    # worker's clock; the sum once read 0.29977.)
    assert sample(samples, f"{name}_bucket", task="alpha", le="0.25") == 3
    assert sample(samples, f"{name}_sum", task="alpha") > 0.25
    for task in ("alpha", "beta"):
        assert sample(samples, "graphile_worker_jobs_running", task=task) == 0
    assert sample(samples, "graphile_worker_local_queue_length") == 0
    for task, failed in (("alpha", 1), ("beta", 2)):
        depth = {
            state: sample(samples, "graphile_worker_queue_depth", task=task, queue="", state=state)
            for state in queue_depth.STATES
        }
        assert depth == {
            "waiting": 0,
            "scheduled": 0,
            "retrying": 0,
            "paused": 0,
            "running": 0,
            "failed": failed,
        }
    assert sample(samples, "process_cpu_seconds_total") > 0


@pytest.mark.unit
def test_metrics_without_the_extra_fail_with_one_line_naming_it(tmp_path: Path) -> None:
    """prometheus-client (opentelemetry) missing: one line naming the extra."""
    for package in ("prometheus_client", "opentelemetry"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {"PYTHONPATH": str(tmp_path)}
    result = run_cli("-c", "postgres://127.0.0.1:1/none", "--metrics-port", "0", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: metrics need prometheus-client: install the metrics extra: "
        "pip install 'graphile-worker[metrics]' "
        "(or pip install '.[metrics]' in a checkout of the repository)"
    ]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "t.py").write_text("async def task(payload, helpers): pass\n")
    result = run_cli("-c", "postgres://127.0.0.1:1/none", "--tracing", env=env, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        (
            "Error: tracing needs the OpenTelemetry API: install the otel extra: "
            "pip install 'graphile-worker[otel]' "
            "(or pip install '.[otel]' in a checkout of the repository)"
        )
    ]


@pytest.mark.unit
def test_a_metrics_port_in_use_fails_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("-c", "postgres://127.0.0.1:1/none", "--metrics-port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: --metrics-port: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ]


# --- Library mode ---------------------------------------------------------------


@pytest.mark.db
async def test_running_and_local_queue_gauges(utils: WorkerUtils, db: str) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def hold(payload: Any, helpers: Helpers) -> None:
        started.set()
        await release.wait()

    async def other(payload: Any, helpers: Helpers) -> None:
        pass

    async with (
        served() as server,
        worker(
            db,
            {"hold": hold, "other": other},
            concurrency=1,
            local_queue_horizon=math.inf,  # fetch every due job ahead
            metrics_registry=server.registry,
        ) as runner,
    ):
        try:
            await utils.add_job("hold")
            await started.wait()
            await utils.add_jobs([{"identifier": "other"}] * 3)
            await until(lambda: runner.pool.load.queued == 3, what="3 jobs fetched ahead")
            samples = await scrape_async(server.url)
        finally:
            release.set()
    # Per task, every task of the worker there: the running one, and 0 for the other.
    assert sample(samples, "graphile_worker_jobs_running", task="hold") == 1
    assert sample(samples, "graphile_worker_jobs_running", task="other") == 0
    assert sample(samples, "graphile_worker_jobs_stuck") == 0
    assert sample(samples, "graphile_worker_local_queue_length") == 3
    depth = "graphile_worker_queue_depth"
    assert sample(samples, depth, task="hold", queue="", state="running") == 1
    assert sample(samples, depth, task="other", queue="", state="running") == 3


@pytest.mark.db
async def test_a_job_stuck_past_its_timeout_is_counted_until_it_ends(
    utils: WorkerUtils, db: str
) -> None:
    """An async task that swallows its timeout's cancellation goes on running:
    stuck once the grace has passed, no longer once it ends."""
    release = asyncio.Event()

    @task_options(timeout=0.1)
    async def deaf(payload: Any, helpers: Helpers) -> None:
        try:
            await release.wait()
        except asyncio.CancelledError:
            await release.wait()  # swallowed: it goes on

    async with (
        served() as server,
        worker(db, {"deaf": deaf}, timeout_grace=0.2, metrics_registry=server.registry) as runner,
    ):
        try:
            await utils.add_job("deaf")
            await until(lambda: runner.pool.load.stuck == 1, what="the job stuck")
            stuck = await scrape_async(server.url)
        finally:
            release.set()
        await until(lambda: runner.pool.load.running == 0, what="the job ended")
        after = await scrape_async(server.url)
    assert sample(stuck, "graphile_worker_jobs_stuck") == 1
    assert sample(stuck, "graphile_worker_jobs_running", task="deaf") == 1
    assert sample(after, "graphile_worker_jobs_stuck") == 0


async def add_jobs_in_every_state(db: str) -> None:
    """For the tasks ``a`` and ``b``, flagged ``held`` (a worker that
    forbids that flag has them and does not run them)."""
    for task, n in (("a", 3), ("b", 2)):
        rows(db, "select graphile_worker.add_jobs(array(select (%s, null, null, null, null, "
             "null, null, null)::graphile_worker.job_spec from generate_series(1, %s)))",
             [task, n])  # fmt: skip
    rows(db, "select graphile_worker.add_job('a', run_at => now() + interval '1 hour')")
    rows(db, "select graphile_worker.add_job('b', run_at => now() + interval '1 hour')")
    ids = [r["id"] for r in rows(db, f"select id from {JOBS} order by id")]
    # a: 2 waiting, 2 retrying (one due, one later)
    # b: 1 running, 1 failed, 1 scheduled
    rows(db, f"update {JOBS} set attempts = 1 where id = any(%s)", [[ids[0], ids[5]]])
    rows(db, f"update {JOBS} set locked_at = now(), locked_by = 'x' where id = %s", [ids[3]])
    rows(db, f"update {JOBS} set attempts = max_attempts where id = %s", [ids[4]])
    rows(db, f"""update {JOBS} set flags = '{{"held": true}}'""")


def add_other_jobs(db: str, tasks: int) -> None:
    """One due job of each of ``tasks`` tasks the worker does not have."""
    rows(db, "select graphile_worker.add_jobs(array(select ('unknown_' || i, null, null, null, "
             "null, null, null, null)::graphile_worker.job_spec from generate_series(1, %s) i))",
         [tasks])  # fmt: skip


@pytest.mark.db
async def test_queue_depth_is_the_status_figures_by_task(db: str) -> None:
    """The worker's tasks each (its jobs held back by a forbidden flag), and
    the other tasks' jobs added up under (other)."""
    await add_jobs_in_every_state(db)
    add_other_jobs(db, 2)
    rows(db, "select graphile_worker.add_job('unknown_3', run_at => now() + interval '1 day')")

    async def nothing(payload: Any, helpers: Helpers) -> None:
        pass

    tasks = {"a": nothing, "b": nothing, "mine": nothing}
    async with (
        served() as server,
        worker(db, tasks, forbidden_flags=["held"], metrics_registry=server.registry),
    ):
        samples = await scrape_async(server.url)
    status = await read_status(db)
    other = queue_depth.OTHER_TASKS
    expected = {
        ("a", "waiting"): 2,
        ("a", "retrying"): 2,
        ("b", "waiting"): 0,
        ("b", "running"): 1,
        ("b", "failed"): 1,
        ("b", "scheduled"): 1,
        (other, "waiting"): 2,
        (other, "scheduled"): 1,
    }
    unknown = [status.tasks[f"unknown_{i}"] for i in (1, 2, 3)]
    for task in ("a", "b", "mine", other):  # the worker's own task too, with no job
        for state in (*queue_depth.STATES, "retrying"):
            if state == "retrying":  # a state, and a gauge of its own (paused ones too)
                got = sample(samples, "graphile_worker_queue_depth_retrying", task=task, queue="")
                assert got == sample(
                    samples, "graphile_worker_queue_depth", task=task, queue="", state=state
                )
            else:
                got = sample(
                    samples, "graphile_worker_queue_depth", task=task, queue="", state=state
                )
            assert got == expected.get((task, state), 0), (task, state)
            if task in ("a", "b"):
                assert got == getattr(status.tasks[task], state), (task, state)
            if task == other:
                assert got == sum(getattr(figures, state) for figures in unknown), state
    assert sample(samples, "graphile_worker_queue_depth_truncated") == 0


@pytest.mark.db
async def test_other_tasks_share_one_series_whatever_their_number(db: str) -> None:
    """5,000 task names the worker does not have made 25,000 series: now the
    worker's tasks and (other), six states each, and nothing else."""
    add_other_jobs(db, 5000)
    rows(db, "select graphile_worker.add_job('mine', run_at => now() + interval '1 day')")

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    async with served() as server, worker(db, {"mine": mine}, metrics_registry=server.registry):
        samples = await scrape_async(server.url)
    depth = {
        (labels["task"], labels["state"]): count
        for (name, label_set), count in samples.items()
        if name == "graphile_worker_queue_depth"
        for labels in [dict(label_set)]
    }
    assert len(depth) == 2 * len(queue_depth.STATES)
    other = queue_depth.OTHER_TASKS
    assert {task for task, _ in depth} == {"mine", other}
    assert depth[(other, "waiting")] == 5000 and depth[("mine", "scheduled")] == 1


@pytest.mark.db
async def test_scrapes_within_the_cache_time_send_one_query(
    utils: WorkerUtils, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(queue_depth, "_clock", lambda: now[0])

    def waiting(samples: Samples) -> float:  # of "a", a task the worker does not have
        other = queue_depth.OTHER_TASKS
        return sample(samples, "graphile_worker_queue_depth", task=other, queue="", state="waiting")

    def queries(samples: Samples) -> float:
        return sample(samples, "graphile_worker_queue_depth_queries_total")

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    async with served() as server, worker(db, {"mine": mine}, metrics_registry=server.registry):
        await utils.add_job("a")
        first = await scrape_async(server.url)
        await utils.add_job("a")
        now[0] += queue_depth.CACHE_SECONDS - 0.1
        second = await scrape_async(server.url)
        now[0] += 0.2
        third = await scrape_async(server.url)
    assert (queries(first), waiting(first)) == (1, 1)
    assert (queries(second), waiting(second)) == (1, 1)  # the cached figures
    assert (queries(third), waiting(third)) == (2, 2)


def paused(samples: Samples) -> dict[tuple[str, str], float]:
    """The graphile_worker_paused series: (kind, name) -> value."""
    return {
        (labels["kind"], labels["name"]): count
        for (name, label_set), count in samples.items()
        if name == "graphile_worker_paused"
        for labels in [dict(label_set)]
    }


@pytest.mark.db
async def test_each_pause_in_force_is_a_series_at_1(
    utils: WorkerUtils, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused queues and tasks (``*`` too), whoever paused them; a pause
    whose time is up is none (before the upkeep deletes it), and a resume
    ends the series with the next query."""
    now = [1000.0]
    monkeypatch.setattr(queue_depth, "_clock", lambda: now[0])

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    await utils.pause(queue="mail")
    await utils.pause(task="*", until=3600, reason="deploy")
    await utils.pause(task="brief", until=2)
    async with (
        served() as server,
        # Polling rarely: the upkeep, which deletes the pauses that ended, waits too.
        worker(db, {"mine": mine}, metrics_registry=server.registry, poll_interval=60),
    ):
        first = await scrape_async(server.url)
        await asyncio.sleep(2.1)
        now[0] += queue_depth.CACHE_SECONDS + 0.1
        second = await scrape_async(server.url)
        assert value(db, "select count(*) from graphile_worker._private_py_pauses") == 3
        await utils.resume(queue="mail")
        now[0] += queue_depth.CACHE_SECONDS + 0.1
        third = await scrape_async(server.url)
    assert paused(first) == {("queue", "mail"): 1, ("task", "*"): 1, ("task", "brief"): 1}
    assert paused(second) == {("queue", "mail"): 1, ("task", "*"): 1}
    assert paused(third) == {("task", "*"): 1}


LIMIT_SERIES = (
    "graphile_worker_limit_running",
    "graphile_worker_limit_max_running",
    "graphile_worker_limit_recent_starts",
    "graphile_worker_limit_max_starts",
)


def limited(samples: Samples) -> dict[tuple[str, str, str], float]:
    """The limits' series: (metric without its prefix, kind, name) -> value."""
    return {
        (name.removeprefix("graphile_worker_limit_"), labels["kind"], labels["name"]): count
        for (name, label_set), count in samples.items()
        if name in LIMIT_SERIES
        for labels in [dict(label_set)]
    }


@pytest.mark.db
async def test_each_limit_has_its_use_and_its_caps(
    utils: WorkerUtils, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots in use (jobs still locked, every partition value) and starts in
    the window, with the caps: only the pair a limit caps; a job that ends
    frees its slot but not its start, and a removed limit's series go with
    the next query."""
    now = [1000.0]
    monkeypatch.setattr(queue_depth, "_clock", lambda: now[0])

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    await utils.set_limit(Limit(max_running=3, max_starts=50, per=3600), task="charge")
    await utils.set_limit(Limit(max_running=2, partition_by="account_id"), task="bill")
    rows(db, "select graphile_worker.add_job('charge') from generate_series(1, 5)")
    rows(
        db,
        "select graphile_worker.add_job('bill', json_build_object('account_id', a)) "
        "from unnest(array['a', 'a', 'a', 'b']) as a",
    )
    fetch = (
        "select id from graphile_worker.py_fetch_limited_jobs("
        "array(select id from graphile_worker._private_tasks), null, 10, 'p')"
    )
    assert len(rows(db, fetch)) == 6  # 3 of charge; 2 of bill's account a, 1 of b
    await utils.set_limit(Limit(max_starts=10, per=60), queue="mail")
    async with (
        served() as server,
        worker(db, {"mine": mine}, metrics_registry=server.registry, poll_interval=60),
    ):
        first = await scrape_async(server.url)
        rows(
            db,
            f"delete from {JOBS} where id in (select id from graphile_worker.jobs "
            "where task_identifier = 'charge' order by id limit 1)",
        )
        await utils.remove_limit(task="bill")
        now[0] += queue_depth.CACHE_SECONDS + 0.1
        second = await scrape_async(server.url)
    assert limited(first) == {
        ("running", "task", "charge"): 3,
        ("max_running", "task", "charge"): 3,
        ("recent_starts", "task", "charge"): 3,
        ("max_starts", "task", "charge"): 50,
        ("running", "task", "bill"): 3,
        ("max_running", "task", "bill"): 2,
        ("recent_starts", "queue", "mail"): 0,
        ("max_starts", "queue", "mail"): 10,
    }
    assert limited(second) == {
        ("running", "task", "charge"): 2,
        ("max_running", "task", "charge"): 3,
        ("recent_starts", "task", "charge"): 3,
        ("max_starts", "task", "charge"): 50,
        ("recent_starts", "queue", "mail"): 0,
        ("max_starts", "queue", "mail"): 10,
    }


@pytest.mark.db
async def test_the_limits_read_for_the_metrics_are_bounded(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most LIMITS_LIMIT limits (by kind and name), each over at most
    PARTITIONS_READ partition values (its figures are then over those)."""
    monkeypatch.setattr(queue_depth, "LIMITS_LIMIT", 3)
    monkeypatch.setattr(queue_depth, "PARTITIONS_READ", 2)

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    rows(
        db, "select graphile_worker.py_set_limit('task', 't' || n, 1) from generate_series(1, 5) n"
    )
    rows(db, "select graphile_worker.py_set_limit('task', 'bill', 1, null, null, 'account_id')")
    rows(
        db,
        "select graphile_worker.add_job('bill', json_build_object('account_id', n)) "
        "from generate_series(1, 4) n",
    )
    fetch = (
        "select id from graphile_worker.py_fetch_limited_jobs("
        "array(select id from graphile_worker._private_tasks), null, 10, 'p')"
    )
    assert len(rows(db, fetch)) == 4  # one per account
    async with (
        served() as server,
        worker(db, {"mine": mine}, metrics_registry=server.registry, poll_interval=60),
    ):
        samples = await scrape_async(server.url)
    assert {key: count for key, count in limited(samples).items() if key[0] == "running"} == {
        ("running", "task", "bill"): 2,
        ("running", "task", "t1"): 0,
        ("running", "task", "t2"): 0,
    }


@pytest.mark.db
async def test_the_metrics_leave_the_registry_when_the_worker_stops(db: str) -> None:
    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    async with served() as server:
        async with worker(db, {"mine": mine}, metrics_registry=server.registry) as runner:
            assert runner.events.wants("job:success")
            samples = await scrape_async(server.url)
            assert (
                sample(samples, "graphile_worker_jobs_total", task="mine", outcome="success") == 0
            )
        assert not runner.events.wants("job:success")
        assert not any(
            name.startswith("graphile_worker") for name, _ in await scrape_async(server.url)
        )
        # A second worker may use the registry now.
        async with worker(db, {"mine": mine}, metrics_registry=server.registry):
            pass


OFF_SCRIPT = """
import asyncio, sys
from worker_cli import run

async def t(payload, helpers):
    pass

async def main():
    runner = await run(sys.argv[1], task_list={"t": t}, once=True, no_handle_signals=True)
    assert runner.pool.tasks["t"].function is t, "a wrapped task"
    assert runner.pool._fetcher._on_fetched is None, "a fetch hook"
    for name in ("job:start", "job:success", "job:error", "job:complete", "stop"):
        assert not runner.events.wants(name), "a listener of " + name
    await runner
    ours = ("metrics", "tracing", "observe.metrics", "observe.tracing", "observe.queue_depth")
    loaded = [m for m in sys.modules if m.split(".")[0] in ("prometheus_client", "opentelemetry")
              or m in ["worker_cli." + name for name in ours]]
    assert not loaded, loaded

asyncio.run(main())
"""


@pytest.mark.db
def test_off_the_worker_runs_none_of_their_code(db: str, tmp_path: Path) -> None:
    """Without metrics and tracing: no wrapper, no listener, no fetch hook,
    and neither extra (nor our modules using them) is even imported."""
    rows(db, "select graphile_worker.add_job('t')")
    script = tmp_path / "off.py"
    script.write_text(OFF_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), db], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert value(db, f"select count(*) from {JOBS}") == 0


@pytest.mark.db
async def test_stranded_tasks_are_a_series_each_with_their_runnable_jobs(db: str) -> None:
    """The worker runs mine (its job held back by a flag): lost (2 runnable;
    its scheduled and failed jobs are not) and node_only (1) are stranded,
    mine is not, and idle (no runnable job) has no series."""
    for run_at in ("now() - interval '1 hour'", "now()", "now()", "now() + interval '1 day'"):
        rows(db, f"select graphile_worker.add_job('lost', run_at => {run_at})")
    rows(db, "select graphile_worker.add_job('node_only')")
    rows(db, "select graphile_worker.add_job('idle', run_at => now() + interval '1 day')")
    rows(db, f"update {JOBS} set attempts = max_attempts where id = (select min(id) from {JOBS})")
    rows(db, "select graphile_worker.add_job('mine', flags => array['held'])")

    async def mine(payload: Any, helpers: Helpers) -> None:
        pass

    async with (
        served() as server,
        worker(db, {"mine": mine}, forbidden_flags=["held"], metrics_registry=server.registry),
    ):
        beats = "select count(*) from graphile_worker._private_py_heartbeats"
        await until(lambda: value(db, beats))
        samples = await scrape_async(server.url)
    stranded = {
        dict(labels)["task"]: got
        for (name, labels), got in samples.items()
        if name == "graphile_worker_tasks_stranded"
    }
    assert stranded == {"lost": 2, "node_only": 1}
