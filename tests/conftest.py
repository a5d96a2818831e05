"""Shared fixtures: a PostgreSQL server, fresh databases, Node graphile-worker.

Every test carries a tier mark (see pyproject.toml and the README's
"Development" section); the check below keeps the marks honest.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from dbhelpers import UNLISTED_HISTORY, value
from fault_helpers import kill_leftover_workers
from node_worker import NodeUnavailable, NodeWorker, install
from pg_server import PgServer, start_server

from worker_cli import WorkerUtils, make_worker_utils
from worker_cli.schema.migrate import migrate

NODE_VERSION = "0.18.0"

#: Fixtures that reach a PostgreSQL server: a ``unit`` test requests none of
#: them, and a test that requests one is marked ``db``.
DB_FIXTURES = frozenset({"pg", "db", "empty_db", "utils", "migrated_template", "private_pg"})
#: Fixtures that run the Node graphile-worker: a test requesting one is marked ``node``.
NODE_FIXTURES = frozenset({"node", "node_factory"})
TIERS = ("unit", "db", "node")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run if a test's tier marks disagree with the fixtures it uses.

    Runs before ``-m`` deselects anything, so every collected test is checked.
    ``item.fixturenames`` is the full closure: a fixture that needs ``pg``
    counts as a database fixture too.
    """
    problems: list[str] = []
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        fixtures = set(getattr(item, "fixturenames", ()))
        db_used = sorted(fixtures & DB_FIXTURES)
        node_used = sorted(fixtures & NODE_FIXTURES)
        wanted = (["db"] if db_used else []) + (["node"] if node_used else [])
        missing = [tier for tier in wanted if tier not in marks]
        if not marks & set(TIERS):
            problems.append(f"{item.nodeid}: no tier mark (give it one of {', '.join(TIERS)})")
        elif "unit" in marks and wanted:
            problems.append(
                f"{item.nodeid}: marked unit but requests {', '.join(db_used + node_used)}"
                f" (mark it {' and '.join(wanted)} instead)"
            )
        elif missing:
            problems.append(
                f"{item.nodeid}: requests {', '.join(db_used + node_used)}"
                f" but is not marked {' and '.join(missing)}"
            )
    if problems:
        raise pytest.UsageError(
            "test tier marks (unit, db, node, slow) are missing or wrong:\n  "
            + "\n  ".join(problems)
        )


@pytest.fixture(autouse=True)
def _connection_settings_stay_with_their_test() -> Iterator[None]:
    """After every test, the connection settings of the environment are as
    before it: the code under test loads a ``.env`` into ``os.environ``
    (python-dotenv), which would otherwise leak its ``DATABASE_URL`` into the
    tests run after it in the same process, to a database dropped since."""
    saved = {name: value for name, value in os.environ.items() if _connection_setting(name)}
    yield
    for name in [name for name in os.environ if _connection_setting(name)]:
        if name not in saved:
            del os.environ[name]
    os.environ.update(saved)


def _connection_setting(name: str) -> bool:
    return name == "DATABASE_URL" or name.startswith(("PG", "GRAPHILE_WORKER_"))


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test() -> Iterator[None]:
    """After every test, kill -9 the worker processes it started and left
    running (a failed test), so that none outlives it."""
    yield
    kill_leftover_workers()


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    # Session-scoped but not autouse: the server is started (or
    # TEST_DATABASE_URL connected to) only when a test needs it, so
    # `pytest -m unit` never starts one.
    with start_server() as server:
        yield server


@pytest.fixture
def empty_db(pg: PgServer) -> Iterator[str]:
    """URL of a new, empty database."""
    with pg.database() as url:
        yield url


@pytest.fixture(scope="session")
def migrated_template(pg: PgServer) -> Iterator[str]:
    """Name of a database holding our migrated schema, used as a template."""
    name = pg.create_database()

    async def build() -> None:
        async with await psycopg.AsyncConnection.connect(pg.url(name), autocommit=True) as conn:
            await migrate(conn, "graphile_worker")

    asyncio.run(build())
    try:
        yield name
    finally:
        pg.drop_database(name)


@pytest.fixture
def db(pg: PgServer, migrated_template: str) -> Iterator[str]:
    """URL of a new database with the schema installed by our migrator. After
    the test, every job it left in the history is listed in the expiry ledger
    (else the pruning would keep it for ever)."""
    with pg.database(template=migrated_template) as url:
        yield url
        if value(url, "select to_regclass('graphile_worker._private_py_job_history_expiry')"):
            unlisted = value(url, UNLISTED_HISTORY)
            assert not unlisted, (
                f"{len(unlisted)} history row(s) missing from the expiry ledger: {unlisted[:20]}"
            )


@pytest.fixture
async def utils(db: str) -> AsyncIterator[WorkerUtils]:
    async with make_worker_utils(connection_string=db) as worker_utils:
        yield worker_utils


#: Why the Node compatibility tests were skipped (printed at the end of the run).
_node_skipped: list[str] = []


def _node(version: str) -> NodeWorker:
    try:
        return install(version)
    except NodeUnavailable as exc:
        if os.environ.get("CI") or os.environ.get("GRAPHILE_WORKER_REQUIRE_NODE"):
            pytest.fail(f"the Node compatibility tests must run here: {exc}")
        _node_skipped.append(str(exc).splitlines()[0])
        pytest.skip(f"Node graphile-worker unavailable: {exc}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly that the Node compatibility tests did not run, and why."""
    if not _node_skipped:
        return
    terminalreporter.section("Node compatibility tests SKIPPED", sep="!", red=True, bold=True)
    skipped = len(
        [r for r in terminalreporter.stats.get("skipped", []) if "Node graphile-worker" in str(r)]
    )
    terminalreporter.write_line(
        f"{skipped} test(s) against the real graphile-worker (Node) did not run: "
        f"{_node_skipped[0]}. They need node and npm (Node 22.18+ is fetched from npm when "
        "the machine's is older); CI fails instead of skipping (GRAPHILE_WORKER_REQUIRE_NODE=1).",
        red=True,
    )


@pytest.fixture(scope="session")
def node() -> NodeWorker:
    """graphile-worker 0.18.0 from npm."""
    return _node(NODE_VERSION)


@pytest.fixture(scope="session")
def node_factory() -> object:
    """Install another graphile-worker version from npm: ``node_factory("0.16.6")``."""
    return _node


#: The Django 6 suite runs in a pytest process of its own (tests/system/test_django_tasks.py).
_DJANGO_SUITE = Path(__file__).resolve().parent / "django_tasks"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave tests/django_tasks out unless it was named on the command line:
    Django is configured once per process, and the README's Django recipe
    (tests/system/test_python_apps.py) configures it otherwise."""
    if collection_path != _DJANGO_SUITE:
        return None
    named = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return not any(path == _DJANGO_SUITE or _DJANGO_SUITE in path.parents for path in named)
