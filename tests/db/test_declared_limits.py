"""A task's declared limit (``@task_options(limit=...)``) applies when the
declaration is new or changed (migrations/py/000024.sql records it as
applied); an operator's change or removal of the limit (the CLI, the
utilities) stands until the task's declaration itself changes. Each "start"
below is a worker run (``run_once`` with nothing to do: the pool starts,
applies its declarations and stops)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dbhelpers import rows, run_cli

from worker_cli import Helpers, Limit, WorkerUtils, run_once, task_options

DECLARED = "graphile_worker._private_py_declared_limits"


def task(limit: Limit | None) -> Any:
    """A task ``charge`` declaring ``limit`` (none: declaring no limit)."""

    async def charge(payload: Any, helpers: Helpers) -> None:
        pass

    return charge if limit is None else task_options(limit=limit)(charge)


async def start(db: str, limit: Limit | None) -> None:
    """A worker starts (and stops) with ``charge`` declaring ``limit``."""
    await run_once(db, task_list={"charge": task(limit)}, no_handle_signals=True)


async def stored(utils: WorkerUtils) -> Limit | None:
    """The limit the database holds for task ``charge``."""
    found = {(i.kind, i.name): i.limit for i in await utils.list_limits()}
    return found.get(("task", "charge"))


def recorded(db: str) -> list[tuple[str, Any]]:
    return [(r["task_identifier"], r["declaration"]) for r in rows(db, f"select * from {DECLARED}")]


@pytest.mark.db
async def test_an_operators_removal_stands_at_the_next_start(utils: WorkerUtils, db: str) -> None:
    await start(db, Limit(max_running=2))
    assert await stored(utils) == Limit(max_running=2)
    assert recorded(db) == [
        (
            "charge",
            {"max_running": 2, "max_starts": None, "per_seconds": None, "partition_by": None},
        )
    ]

    removed = run_cli("limit", "-c", db, "--task", "charge", "--remove")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout == "Removed the limit of task charge\n"
    assert removed.stderr == (
        "Warning: task charge declares a limit (@task_options(limit=...)); this removal "
        "stands until that declaration changes in the code, when the next worker start "
        "that loads it applies the new one\n"
    )
    await start(db, Limit(max_running=2))
    await start(db, Limit(max_running=2))
    assert await stored(utils) is None


@pytest.mark.db
async def test_an_operators_change_stands_at_the_next_start(utils: WorkerUtils, db: str) -> None:
    declared = Limit(max_running=2, max_starts=10, per=1.5, partition_by="account_id")
    await start(db, declared)
    assert await stored(utils) == declared

    changed = run_cli("limit", "-c", db, "--task", "charge", "--max-running", "5")
    assert changed.returncode == 0, changed.stderr
    assert changed.stderr == (
        "Warning: task charge declares a limit (@task_options(limit=...)); this limit "
        "stands until that declaration changes in the code, when the next worker start "
        "that loads it applies the new one\n"
    )
    await start(db, declared)
    assert await stored(utils) == Limit(max_running=5)


@pytest.mark.db
async def test_a_changed_declaration_applies_at_the_next_start(utils: WorkerUtils, db: str) -> None:
    await start(db, Limit(max_running=2))
    await utils.remove_limit(task="charge")
    await start(db, Limit(max_running=2))
    assert await stored(utils) is None  # the removal stood
    await start(db, Limit(max_running=3))
    assert await stored(utils) == Limit(max_running=3)
    await utils.set_limit(Limit(max_running=7), task="charge")
    await start(db, Limit(max_running=3, partition_by="account_id"))
    assert await stored(utils) == Limit(max_running=3, partition_by="account_id")


@pytest.mark.db
async def test_a_declaration_removed_then_added_again_applies_again(
    utils: WorkerUtils, db: str
) -> None:
    await start(db, Limit(max_running=2))
    await utils.set_limit(Limit(max_running=9), task="charge")
    await start(db, Limit(max_running=2))
    assert await stored(utils) == Limit(max_running=9)  # the operator's stood

    # The code drops the declaration: the stored limit stays, its record goes.
    await start(db, None)
    assert await stored(utils) == Limit(max_running=9)
    assert recorded(db) == []
    # A worker without the task at all leaves another task's record alone.
    await start(db, Limit(max_running=2))
    await run_once(db, task_list={"other": task(None)}, no_handle_signals=True)
    assert [name for name, _ in recorded(db)] == ["charge"]
    await utils.set_limit(Limit(max_running=9), task="charge")

    # Declared again, the same as before: it applies again.
    await start(db, None)
    await start(db, Limit(max_running=2))
    assert await stored(utils) == Limit(max_running=2)


@pytest.mark.db
async def test_the_cli_says_nothing_of_a_task_that_declares_no_limit(
    utils: WorkerUtils, db: str
) -> None:
    await start(db, None)
    changed = run_cli("limit", "-c", db, "--task", "charge", "--max-running", "5")
    assert (changed.returncode, changed.stderr) == (0, "")
    removed = run_cli("limit", "-c", db, "--task", "charge", "--remove")
    assert (removed.returncode, removed.stderr) == (0, "")
    # Nothing removed: nothing to say of the declaration either.
    await start(db, Limit(max_running=2))
    await utils.remove_limit(task="charge")
    again = run_cli("limit", "-c", db, "--task", "charge", "--remove")
    assert (again.stdout, again.stderr) == ("Task charge had no limit\n", "")


@pytest.mark.db
async def test_two_workers_starting_at_once_both_start(utils: WorkerUtils, db: str) -> None:
    for declared in (Limit(max_running=2), Limit(max_running=4)):
        await asyncio.gather(*(start(db, declared) for _ in range(4)))
        assert await stored(utils) == declared
        assert len(recorded(db)) == 1


@pytest.mark.db
async def test_a_schema_without_the_record_applies_every_declaration_as_before(
    utils: WorkerUtils, db: str
) -> None:
    rows(db, f"drop table {DECLARED}")
    await start(db, Limit(max_running=2))
    assert await stored(utils) == Limit(max_running=2)
    removed = run_cli("limit", "-c", db, "--task", "charge", "--remove")
    assert (removed.returncode, removed.stderr) == (0, "")
    await start(db, Limit(max_running=2))
    assert await stored(utils) == Limit(max_running=2)
