"""Every dashboard statement stays bounded on a large queue: EXPLAINed on
200,000 jobs (and 20,000 named queues, 200,000 finished jobs in the history,
200,000 workflows, one of 10,000 steps), none scans ``_private_jobs``, the
history or the workflows' tables sequentially, and each reads the index its
comment in ``worker_cli/sql/dashboard.py`` (or
``worker_cli/sql/dashboard_workflows.py``) names."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.types.json import Jsonb

from worker_cli.dashboard import filters as queries
from worker_cli.dashboard import workflow_graph
from worker_cli.dashboard.job_counts import sample_percent
from worker_cli.sql import compose
from worker_cli.sql import dashboard as dashboard_sql
from worker_cli.sql import dashboard_workflows as workflows_sql
from worker_cli.sql import limits as limits_sql
from worker_cli.sql import status as status_sql

pytestmark = pytest.mark.db

JOBS, QUEUES, TASKS = 200_000, 20_000, 20
HISTORY = 200_000
#: Limits, and partition values of one of them.
LIMITS, PARTITIONS = 300, 3_000
#: The tables no statement may scan sequentially: they may hold millions of
#: rows (named queues, tens of thousands).
LARGE = ("_private_jobs", "_private_py_job_history", "_private_job_queues")
#: Workflows; the steps of the newest (running), and of each of the
#: SMALL_WORKFLOWS before it.
WORKFLOWS, BIG_STEPS, SMALL_WORKFLOWS, SMALL_STEPS = 200_000, 10_000, 40_000, 5
#: The workflows' tables (and the jobs, for their steps' live state).
WORKFLOW_TABLES = (
    "_private_py_workflows",
    "_private_py_workflow_steps",
    "_private_py_workflow_edges",
    "_private_jobs",
)


@pytest.fixture(scope="module")
def big_queue(pg: Any, migrated_template: str) -> Iterator[str]:
    """A database with 200,000 jobs in every state, analyzed."""
    with pg.database(template=migrated_template) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "insert into graphile_worker._private_tasks (identifier) "
                "select 'task_' || n from generate_series(1, %s) as n",
                (TASKS,),
            )
            conn.execute(
                "insert into graphile_worker._private_job_queues (queue_name) "
                "select 'queue_' || n from generate_series(1, %s) as n",
                (QUEUES,),
            )
            # Every tenth job in a named queue; three priorities; run_at from
            # three hours ago to three hours ahead; every 97th failed for
            # good, every 89th locked, every 13th retrying.
            conn.execute(
                """
                insert into graphile_worker._private_jobs (
                  task_id, job_queue_id, payload, priority, run_at, attempts, max_attempts,
                  last_error, locked_at, locked_by)
                select t.id,
                  case when n %% 10 = 0 then 1 + n %% %(queues)s end,
                  %(payload)s::json,
                  n %% 3,
                  now() + ((n %% 7) - 3) * interval '1 hour',
                  case when n %% 97 = 0 then 25 when n %% 13 = 0 then 2 else 0 end,
                  25,
                  case when n %% 97 = 0 or n %% 13 = 0 then 'boom ' || n end,
                  case when n %% 89 = 0 then now() end,
                  case when n %% 89 = 0 then 'pool-' || n %% 4 end
                from generate_series(1, %(jobs)s) as n
                join graphile_worker._private_tasks as t
                  on t.identifier = 'task_' || (1 + n %% %(tasks)s)
                """,
                {"jobs": JOBS, "queues": QUEUES, "tasks": TASKS, "payload": Jsonb({"n": 1})},
            )
            # The history: finished over the last day, in batches of 50 (one
            # finished_at each); every 10th failed, every 7th cancelled.
            conn.execute(
                """
                insert into graphile_worker._private_py_job_history (
                  job_id, state, task_identifier, queue_name, priority, attempts, max_attempts,
                  revision, result, last_error, created_at, run_at, started_at, finished_at,
                  cancel_reason, expires_at)
                select %(jobs)s + n,
                  case when n %% 10 = 0 then 'failed' when n %% 7 = 0 then 'cancelled'
                    else 'succeeded' end,
                  'task_' || (1 + n %% %(tasks)s), null, 0, 1, 25, 0,
                  case when n %% 10 <> 0 and n %% 7 <> 0 then '{"ok": true}'::json end,
                  case when n %% 10 = 0 then 'boom ' || n end,
                  f.at - interval '1 minute', f.at - interval '1 minute', f.at, f.at,
                  case when n %% 7 = 0 then 'no longer needed' end,
                  f.at + interval '1 day'
                from generate_series(1, %(history)s) as n
                cross join lateral (
                  select now() - interval '1 day' + (n / 50) * interval '20 seconds' as at
                ) as f
                """,
                {"jobs": JOBS, "tasks": TASKS, "history": HISTORY},
            )
            conn.execute(
                "insert into graphile_worker._private_py_heartbeats (pool_id, timeout) "
                "values ('pool-1', interval '5 minutes')"
            )
            conn.execute(
                "insert into graphile_worker._private_known_crontabs (identifier, known_since) "
                "values ('nightly', now())"
            )
            conn.execute(
                "insert into graphile_worker._private_py_pauses (kind, name, resume_at) "
                "values ('queue', 'queue_1', null), ('task', 'task_2', now() + interval '1 hour'), "
                "('task', 'task_3', now() - interval '1 hour')"
            )
            # Limits: 300 (more than the panel reads), one with 3,000 partition
            # values (more than it reads of one), their running jobs by id
            # (every 89th job is locked). task_1's starts are counted over a
            # day: the module's other tests run between this fixture and the
            # test reading them (over a second, its period was once over).
            conn.execute(
                "insert into graphile_worker._private_py_limits "
                "(kind, name, max_running, max_starts, period, partition_by) "
                "values ('task', 'task_1', 3, 50, interval '1 day', null), "
                "('task', 'task_2', 2, null, null, 'account_id')"
            )
            conn.execute(
                "insert into graphile_worker._private_py_limits (kind, name, max_running) "
                "select 'task', 'z_' || n, 1 from generate_series(1, %s) as n",
                (LIMITS - 2,),
            )
            conn.execute(
                "insert into graphile_worker._private_py_limit_state "
                "(kind, name, partition, running, starts, started) "
                "values ('task', 'task_1', '', array[89, 178, 5], "
                "array[now(), now(), now()], array[89, 178, 5])"
            )
            conn.execute(
                "insert into graphile_worker._private_py_limit_state "
                "(kind, name, partition, running) "
                "select 'task', 'task_2', n::text, array[n * 89, n * 89 + 1] "
                "from generate_series(1, %s) as n",
                (PARTITIONS,),
            )
            add_workflows(conn)
            conn.execute("analyze")
        yield url


def add_workflows(conn: psycopg.Connection[Any]) -> None:
    """WORKFLOWS workflows: every 10th failed, every 7th cancelled, the newest
    2,000 running, the others succeeded, finished over the last two days;
    the SMALL_WORKFLOWS before the newest SMALL_STEPS steps each (a chain), then the
    newest, BIG_STEPS steps (a binary tree: step n waits for step n / 2; its
    first 1,000 queued with a job each)."""
    conn.execute(
        """
        insert into graphile_worker._private_py_workflows (
          name, state, steps, steps_left, succeeded, failed, cancelled, created_at, finished_at)
        select 'wf ' || n, s.state, 5, case when s.state = 'running' then 5 else 0 end,
          case when s.state = 'succeeded' then 5 else 0 end,
          case when s.state = 'failed' then 1 else 0 end,
          case when s.state = 'cancelled' then 1 else 0 end,
          now() - (%(n)s - n) * interval '3 seconds',
          case when s.state <> 'running' then now() - (%(n)s - n) * interval '3 seconds' end
        from generate_series(1, %(n)s) as n
        cross join lateral (
          select case when n > %(n)s - 2000 then 'running' when n %% 10 = 0 then 'failed'
            when n %% 7 = 0 then 'cancelled' else 'succeeded' end as state
        ) as s
        order by n
        """,
        {"n": WORKFLOWS},
    )
    conn.execute(
        """
        update graphile_worker._private_py_workflows set steps = %(big)s, steps_left = %(big)s
        where id = %(n)s
        """,
        {"big": BIG_STEPS, "n": WORKFLOWS},
    )
    conn.execute(
        """
        insert into graphile_worker._private_py_workflow_steps (
          workflow_id, ref, position, task_identifier, spec, run_if, state, parents)
        select w, 'step-' || p, p, 'task_1', '{}', 'succeeded', 'succeeded',
          case when p > 1 then 1 else 0 end
        from generate_series(%(n)s - %(small)s, %(n)s - 1) as w
        cross join generate_series(1, %(steps)s) as p
        """,
        {"n": WORKFLOWS, "small": SMALL_WORKFLOWS, "steps": SMALL_STEPS},
    )
    conn.execute(
        """
        insert into graphile_worker._private_py_workflow_steps (
          workflow_id, ref, position, task_identifier, spec, run_if, state, parents, job_id)
        select %(n)s, 'step-' || p, p, 'task_1', '{}', 'succeeded',
          case when p <= 1000 then 'queued' else 'blocked' end,
          case when p > 1 then 1 else 0 end, case when p <= 1000 then p end
        from generate_series(1, %(big)s) as p
        """,
        {"n": WORKFLOWS, "big": BIG_STEPS},
    )
    # The links: step n waits for step n / 2 in the big one, for step n - 1
    # in the others.
    conn.execute(
        """
        insert into graphile_worker._private_py_workflow_edges (parent_id, child_id)
        select p.id, c.id
        from graphile_worker._private_py_workflow_steps as c
        join graphile_worker._private_py_workflow_steps as p
          on p.workflow_id = c.workflow_id
          and p.position = case when c.workflow_id = %(n)s then c.position / 2
            else c.position - 1 end
        where c.position > 1
        """,
        {"n": WORKFLOWS},
    )


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def explain(
    url: str, statement: LiteralString, costs: dict[str, float] | None = None, **params: Any
) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        for setting, value in (costs or {}).items():
            conn.execute("select set_config(%s, %s, false)", (setting, str(value)))
        query = psycopg.sql.SQL("explain (format json) ") + compose(statement, "graphile_worker")
        [(result,)] = conn.execute(query, params).fetchall()
    return list(plan_nodes(result[0]["Plan"]))


def scans(nodes: list[dict[str, Any]], relation: str) -> list[str]:
    """How each scan of ``relation`` reads it: its node type and index, if any."""
    return [
        f"{node['Node Type']} {node.get('Index Name', '')}".strip()
        for node in nodes
        if node.get("Relation Name") == relation
    ]


HISTORY_INDEX = "_private_py_job_history_pkey"
#: The history's times are around the fixture's now(): this is close enough.
NOW = datetime.now(UTC)

CASES: list[tuple[str, LiteralString, dict[str, Any], dict[str, set[str]]]] = [
    (
        "oldest due",
        dashboard_sql.OLDEST_DUE,
        {},
        {"_private_jobs": {"jobs_main_index"}},
    ),
    (
        "latest failures",
        dashboard_sql.LATEST_FAILURES,
        {"window": queries.WINDOW, "limit": 10},
        {"_private_jobs": {"jobs_pkey1"}},
    ),
    (
        "jobs, no filter",
        dashboard_sql.JOBS_PAGE,
        {
            "before": 2**63 - 1,
            "window": queries.WINDOW,
            "limit": 51,
            "task": None,
            "queue": None,
            "state": None,
        },
        {"_private_jobs": {"jobs_pkey1"}},
    ),
    (
        "jobs, every filter, from a cursor",
        dashboard_sql.JOBS_PAGE,
        {
            "before": 150_000,
            "window": queries.WINDOW,
            "limit": 51,
            "task": "task_3",
            "queue": "queue_30",
            "state": "retrying",
        },
        {"_private_jobs": {"jobs_pkey1"}, "_private_job_queues": {"job_queues_queue_name_key"}},
    ),
    ("a job", dashboard_sql.JOB, {"id": 12345}, {"_private_jobs": {"jobs_pkey1"}}),
    (
        "limits and their use",
        limits_sql.LIMIT_USAGE,
        {"limit": 201, "partitions": 1001},
        {"_private_jobs": {"jobs_pkey1"}},
    ),
    (
        "stranded tasks",
        status_sql.STRANDED_TASKS,
        {"tasks": 1000, "cap": 10_001},
        {"_private_jobs": {"_private_py_jobs_task_order"}},
    ),
    (
        "named queues",
        dashboard_sql.QUEUES,
        {"limit": 51},
        {"_private_job_queues": {"job_queues_queue_name_key"}},
    ),
    (
        "queue holders",
        dashboard_sql.QUEUE_HOLDERS,
        {"window": queries.WINDOW},
        {"_private_job_queues": {"job_queues_pkey1"}},
    ),
    (
        "finished, no filter",
        dashboard_sql.FINISHED_PAGE,
        {
            "upper_id": None,
            "after": None,
            "before": None,
            "window": queries.WINDOW,
            "limit": 51,
            "task": None,
            "state": None,
            "preview_max": 16384,
        },
        {"_private_py_job_history": {HISTORY_INDEX}},
    ),
    (
        "finished, every filter, from a cursor",
        dashboard_sql.FINISHED_PAGE,
        {
            "upper_id": JOBS + 100_000,
            "after": NOW - timedelta(hours=20),
            "before": NOW - timedelta(hours=12),
            "window": queries.WINDOW,
            "limit": 51,
            "task": "task_3",
            "state": "cancelled",
            "preview_max": 16384,
        },
        {"_private_py_job_history": {HISTORY_INDEX}},
    ),
    (
        "latest finished",
        dashboard_sql.LATEST_FINISHED,
        {},
        {"_private_py_job_history": {HISTORY_INDEX}},
    ),
    (
        "a finished job",
        dashboard_sql.FINISHED_JOB,
        {"id": JOBS + 12345, "cut": 1_000_000},
        {"_private_py_job_history": {"_private_py_job_history_pkey"}},
    ),
]


# The planner's choice depends on its cost settings and on the statistics
# ANALYZE sampled: the plans are checked as configured and where reading pages
# in order looks cheap (a table held in memory) or random reads dear. A window
# of 10,000 jobs joined back to the table by id once became a hash join over a
# sequential scan with the statistics of one CI run; with seq_page_cost 0.1 it
# does here every time.
COSTS: dict[str, dict[str, float]] = {
    "default costs": {},
    "cheap sequential pages": {"seq_page_cost": 0.1},
    "dear random pages": {"random_page_cost": 20},
}


@pytest.mark.parametrize("costs", COSTS.values(), ids=COSTS.keys())
@pytest.mark.parametrize(
    ("statement", "params", "indexes"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_no_statement_scans_the_jobs_sequentially(
    big_queue: str,
    statement: LiteralString,
    params: dict[str, Any],
    indexes: dict[str, set[str]],
    costs: dict[str, float],
) -> None:
    nodes = explain(big_queue, statement, costs, **params)
    assert any(scans(nodes, table) for table in LARGE), "the statement reads no large table"
    for table in LARGE:
        table_scans = scans(nodes, table)
        assert not [scan for scan in table_scans if scan.startswith("Seq Scan")], table_scans
    for relation, wanted in indexes.items():
        used = {scan.split(" ")[-1] for scan in scans(nodes, relation)}
        assert wanted <= used, f"{relation}: {scans(nodes, relation)}"


@pytest.mark.parametrize("percent", [100.0, 1.0])
def test_the_counts_read_a_sample_of_the_jobs(big_queue: str, percent: float) -> None:
    nodes = explain(big_queue, dashboard_sql.CENSUS, percent=percent)
    assert scans(nodes, "_private_jobs") == ["Sample Scan"]


def test_the_sample_is_bounded_on_a_large_table(big_queue: str) -> None:
    """200,000 jobs are over the sample's 2,000 pages: the counts are sampled,
    and the pages actually read stay near the bound."""
    with psycopg.connect(big_queue) as conn:
        [(pages,)] = conn.execute(
            compose(dashboard_sql.JOBS_PAGES, "graphile_worker"), {"schema": "graphile_worker"}
        ).fetchall()
        percent = sample_percent(pages)
        assert percent < 100
        query = psycopg.sql.SQL("explain (analyze, buffers, format json) ") + compose(
            dashboard_sql.CENSUS, "graphile_worker"
        )
        [(result,)] = conn.execute(query, {"percent": percent}).fetchall()
    [sample] = [n for n in plan_nodes(result[0]["Plan"]) if n["Node Type"] == "Sample Scan"]
    read = sample["Shared Hit Blocks"] + sample["Shared Read Blocks"]
    assert read < 2_000 * 1.25, (pages, percent, read)


def test_a_deep_page_of_the_finished_view_reads_only_its_window(big_queue: str) -> None:
    """A page from a cursor half-way down the history, filtered by a time range
    and a rare task: the primary key is entered at the cursor (an index
    condition), so the rows read are at most the window, not every row newer
    than the cursor."""
    params = dict(
        CASES[[case[0] for case in CASES].index("finished, every filter, from a cursor")][2]
    )
    with psycopg.connect(big_queue) as conn:
        query = psycopg.sql.SQL("explain (analyze, format json) ") + compose(
            dashboard_sql.FINISHED_PAGE, "graphile_worker"
        )
        [(result,)] = conn.execute(query, params).fetchall()
    [scan] = [
        node
        for node in plan_nodes(result[0]["Plan"])
        if node.get("Index Name") == HISTORY_INDEX
        and "upper_id" not in str(node)
        and node.get("Scan Direction") == "Backward"
    ]
    assert "job_id <" in scan["Index Cond"], scan
    read = scan["Actual Rows"] * scan["Actual Loops"] + scan.get("Rows Removed by Filter", 0)
    assert 0 < read <= queries.WINDOW, scan


def generic(statement: LiteralString) -> tuple[str, list[str]]:
    """``statement`` with its ``%(name)s`` placeholders as ``$1``, ``$2``...
    (the form PostgreSQL plans once for every value), and their names."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement).replace("%%", "%")
    return text.format(schema='"graphile_worker"'), names


@pytest.mark.parametrize(
    "case", [case for case in CASES if case[0].startswith("finished")], ids=lambda case: case[0]
)
def test_the_finished_view_is_bounded_by_a_generic_plan_too(
    big_queue: str, case: tuple[str, LiteralString, dict[str, Any], dict[str, set[str]]]
) -> None:
    """psycopg prepares a statement run five times, and PostgreSQL may then plan
    it once for any values (a generic plan): the keyset's bounds must be index
    conditions without their values too (no ``$1 is null or ...``)."""
    text, names = generic(case[1])
    with psycopg.connect(big_queue) as conn:
        if conn.info.server_version < 160000:
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16")
        [(result,)] = conn.execute(
            "explain (generic_plan, format json) " + text  # type: ignore[arg-type]
        ).fetchall()
    nodes = list(plan_nodes(result[0]["Plan"]))
    assert not [s for s in scans(nodes, "_private_py_job_history") if s.startswith("Seq Scan")]
    backward = [
        node
        for node in nodes
        if node.get("Index Name") == HISTORY_INDEX and node.get("Scan Direction") == "Backward"
    ]
    assert len(backward) == 1, backward
    if "upper_id" in names:
        assert "job_id <" in backward[0]["Index Cond"], backward


#: The statements about small tables (one row per pool, crontab line, task or pause),
#: and exactly what each reads: never the jobs or the history.
SMALL: list[tuple[str, LiteralString, dict[str, Any], set[str]]] = [
    ("pool alive", dashboard_sql.POOL_ALIVE, {"pool_id": "pool-1"}, {"_private_py_heartbeats"}),
    ("heartbeats", dashboard_sql.HEARTBEATS, {"limit": 500}, {"_private_py_heartbeats"}),
    ("crontab", dashboard_sql.CRONTAB, {"limit": 500}, {"_private_known_crontabs"}),
    ("tasks", dashboard_sql.TASK_IDENTIFIERS, {"limit": 500}, {"_private_tasks"}),
    ("pauses", dashboard_sql.PAUSES, {"limit": 201}, {"_private_py_pauses"}),
]


@pytest.mark.parametrize(
    ("statement", "params", "relations"),
    [case[1:] for case in SMALL],
    ids=[case[0] for case in SMALL],
)
def test_the_small_statements_read_only_their_small_table(
    big_queue: str, statement: LiteralString, params: dict[str, Any], relations: set[str]
) -> None:
    nodes = explain(big_queue, statement, **params)
    read = {node["Relation Name"] for node in nodes if "Relation Name" in node}
    assert read == relations


def test_the_limits_statement_reads_a_bounded_number_of_limits_and_partitions(
    big_queue: str,
) -> None:
    """Of 300 limits, at most ``limit`` are read whole; of a limit's 3,000
    partition values, at most ``partitions``; and the figures are right over
    those (each partition's running jobs: the ones still locked)."""
    with psycopg.connect(big_queue) as conn:
        query = psycopg.sql.SQL("explain (analyze, format json) ") + compose(
            limits_sql.LIMIT_USAGE, "graphile_worker"
        )
        params = {"limit": 201, "partitions": 1001}
        [(result,)] = conn.execute(query, params).fetchall()
        found = conn.execute(compose(limits_sql.LIMIT_USAGE, "graphile_worker"), params).fetchall()
    nodes = list(plan_nodes(result[0]["Plan"]))
    assert result[0]["Plan"]["Actual Rows"] == 201
    states = [n for n in nodes if n.get("Relation Name") == "_private_py_limit_state"]
    assert states, nodes
    for node in states:
        assert node["Node Type"] == "Index Scan", node
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        assert read <= 1001 * node["Actual Loops"], node
        assert node["Actual Rows"] <= 1001, node
    by_name = {(row[0], row[1]): row for row in found}
    # running, busiest_running, recent_starts, busiest_starts, partitions
    assert by_name[("task", "task_1")][7:] == (2, 2, 3, 3, 1)
    task_2 = by_name[("task", "task_2")]
    # Partition n runs jobs n * 89 (locked while a job of that id exists: the
    # fixture locks every 89th) and n * 89 + 1 (never locked); the values read
    # are the first 1,001 in the order of the text.
    read = sorted(str(n) for n in range(1, PARTITIONS + 1))[:1001]
    assert task_2[7:] == (len([n for n in read if int(n) * 89 <= JOBS]), 1, 0, 0, 1001)


def test_the_stranded_statement_counts_at_most_its_cap_per_priority(big_queue: str) -> None:
    """A live pool runs task_1 only: the 18 other tasks not paused (about 5,700 due jobs
    each, over three priorities) are stranded, each counted up to the cap,
    and the jobs' index yields at most the cap per task and priority."""
    with psycopg.connect(big_queue) as conn:
        # (the fixture's pool-1 lists no tasks: it might run any; rolled back)
        conn.execute("delete from graphile_worker._private_py_heartbeats")
        conn.execute(
            "insert into graphile_worker._private_py_heartbeats "
            "(pool_id, timeout, task_identifiers) values ('pool-s', interval '5 minutes', "
            "'{task_1}')"
        )
        params = {"tasks": 1000, "cap": 101}
        found = conn.execute(
            compose(status_sql.STRANDED_TASKS, "graphile_worker"), params
        ).fetchall()
        query = psycopg.sql.SQL("explain (analyze, format json) ") + compose(
            status_sql.STRANDED_TASKS, "graphile_worker"
        )
        [(result,)] = conn.execute(query, params).fetchall()
        conn.rollback()
    # task_2 is paused (the fixture's pauses): held by its pause, not stranded.
    assert sorted(row[0] for row in found) == sorted(f"task_{n}" for n in range(3, TASKS + 1))
    assert {row[1] for row in found} == {101}
    for node in plan_nodes(result[0]["Plan"]):
        if node.get("Relation Name") == "_private_jobs":
            assert node.get("Index Name") == "_private_py_jobs_task_order", node
            assert node["Actual Rows"] <= 101 * node["Actual Loops"], node


STEPS_INDEX = "_private_py_workflow_steps_position"
#: The ids of the steps the big workflow's graph draws (its first by position,
#: added after the others' steps).
DRAWN = list(
    range(
        SMALL_WORKFLOWS * SMALL_STEPS + 1,
        SMALL_WORKFLOWS * SMALL_STEPS + workflow_graph.GRAPH_STEPS + 1,
    )
)

#: The Workflows pages' statements, and the indexes each reads.
WORKFLOW_CASES: list[tuple[str, LiteralString, dict[str, Any], set[str]]] = [
    (
        "workflows, no filter",
        workflows_sql.WORKFLOWS_PAGE,
        {"before": 2**63 - 1, "window": queries.WINDOW, "limit": 51, "state": None, "cut": 2000},
        {"_private_py_workflows_pkey"},
    ),
    (
        "workflows, failed, from a cursor",
        workflows_sql.WORKFLOWS_PAGE,
        {"before": 150_000, "window": queries.WINDOW, "limit": 51, "state": "failed", "cut": 2000},
        {"_private_py_workflows_pkey"},
    ),
    (
        "running workflows",
        workflows_sql.RUNNING_WORKFLOWS_PAGE,
        {"before": WORKFLOWS - 1_000, "limit": 51, "cut": 2000},
        {"_private_py_workflows_running"},
    ),
    (
        "a workflow",
        workflows_sql.WORKFLOW,
        {"id": WORKFLOWS, "cut": 2000},
        {"_private_py_workflows_pkey"},
    ),
    (
        "the steps drawn",
        workflows_sql.WORKFLOW_STEPS_PAGE,
        {"workflow_id": WORKFLOWS, "after": 0, "limit": workflow_graph.GRAPH_STEPS},
        {STEPS_INDEX, "jobs_pkey1"},
    ),
    (
        "a page of steps",
        workflows_sql.WORKFLOW_STEPS_PAGE,
        {"workflow_id": WORKFLOWS, "after": 5_000, "limit": 101},
        {STEPS_INDEX},
    ),
    (
        "the links among the steps drawn",
        workflows_sql.WORKFLOW_EDGES,
        {"ids": DRAWN, "limit": workflow_graph.EDGES_READ},
        {"_private_py_workflow_edges_child"},
    ),
]


@pytest.mark.parametrize("costs", COSTS.values(), ids=COSTS.keys())
@pytest.mark.parametrize(
    ("statement", "params", "indexes"),
    [case[1:] for case in WORKFLOW_CASES],
    ids=[case[0] for case in WORKFLOW_CASES],
)
def test_the_workflow_statements_read_their_indexes(
    big_queue: str,
    statement: LiteralString,
    params: dict[str, Any],
    indexes: set[str],
    costs: dict[str, float],
) -> None:
    nodes = explain(big_queue, statement, costs, **params)
    for table in WORKFLOW_TABLES:
        assert not [s for s in scans(nodes, table) if s.startswith("Seq Scan")], table
    used = {node["Index Name"] for node in nodes if "Index Name" in node}  # bitmap scans too
    assert indexes <= used, used


def analyzed(url: str, statement: LiteralString, **params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        query = psycopg.sql.SQL("explain (analyze, format json) ") + compose(
            statement, "graphile_worker"
        )
        [(result,)] = conn.execute(query, params).fetchall()
    return list(plan_nodes(result[0]["Plan"]))


def rows_read(nodes: list[dict[str, Any]], relation: str) -> int:
    """The rows the scans of ``relation`` read, kept or filtered out."""
    return sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in nodes
        if node.get("Relation Name") == relation
    )


def test_a_workflow_page_reads_only_that_workflows_steps(big_queue: str) -> None:
    """The big workflow's steps (of 210,000 in the table): at most its own
    BIG_STEPS are read, and only the page's steps' jobs; of its links, at
    most the limit."""
    steps = analyzed(
        big_queue,
        workflows_sql.WORKFLOW_STEPS_PAGE,
        workflow_id=WORKFLOWS,
        after=0,
        limit=workflow_graph.GRAPH_STEPS,
    )
    assert 0 < rows_read(steps, "_private_py_workflow_steps") <= BIG_STEPS
    assert rows_read(steps, "_private_jobs") <= workflow_graph.GRAPH_STEPS
    links = analyzed(big_queue, workflows_sql.WORKFLOW_EDGES, ids=DRAWN, limit=300)
    # (Actual Rows is a mean per loop, rounded: the root's loop found none.)
    assert 0 < rows_read(links, "_private_py_workflow_edges") <= 300 + 10
    page = analyzed(
        big_queue,
        workflows_sql.WORKFLOWS_PAGE,
        before=2**63 - 1,
        window=1_000,
        limit=51,
        state="no such state",
        cut=2000,
    )
    assert rows_read(page, "_private_py_workflows") <= 1_000
