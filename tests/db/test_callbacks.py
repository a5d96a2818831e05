"""User code that misbehaves never takes the worker down.

A ``forbidden_flags`` function that raises, an event handler that raises
(sync or async, ``SystemExit`` too), an exception whose ``__str__`` raises,
a batch task returning a list of the wrong length: each is logged, the job
concerned (if any) gets the outcome graphile-worker gives it, and the worker
carries on running jobs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from dbhelpers import rows, value
from workers import Recorder, until, worker

from worker_cli import Helpers, WorkerUtils
from worker_cli.observe.events import Events

pytestmark = pytest.mark.db


async def _wait_for_empty_queue(db: str, within: float = 10) -> None:
    await until(
        lambda: value(db, "select count(*) from graphile_worker._private_jobs") == 0,
        within,
        "every job to be done",
    )


async def test_a_forbidden_flags_function_that_raises_is_retried(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A flag service timing out: the fetch fails, is reported as
    ``worker:getJob:error`` and retried with backoff; the worker runs on."""
    calls = 0

    def forbidden_flags() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("flag service down")
        return ["never"]

    events = Events()
    recorder = Recorder(events, "worker:getJob:error", "job:success")

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events, forbidden_flags=forbidden_flags) as runner:
        for n in range(4):
            await runner.add_job("t", {"n": n})
            await recorder.wait_for("job:success", n + 1)
        assert not runner._task.done()
    [error] = recorder.of("worker:getJob:error")
    assert str(error["error"]) == "flag service down"
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert any(
        "Failed to fetch jobs" in r.getMessage() and "flag service down" in r.getMessage()
        for r in caplog.records
    )


async def test_an_async_forbidden_flags_function_that_raises_is_retried(db: str) -> None:
    calls = 0

    async def forbidden_flags() -> list[str]:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise TimeoutError("flag service timed out")
        return []

    events = Events()
    recorder = Recorder(events, "worker:getJob:error", "job:success")

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events, forbidden_flags=forbidden_flags) as runner:
        await recorder.wait_for("worker:getJob:error", 2)
        await runner.add_job("t")
        await recorder.wait_for("job:success")


@pytest.mark.parametrize("kind", ["sync", "sync SystemExit", "async", "async SystemExit"])
async def test_event_handlers_that_raise_are_logged_and_ignored(
    db: str, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    error: BaseException = SystemExit(3) if "SystemExit" in kind else RuntimeError("handler boom")

    def sync_handler(event: dict[str, Any]) -> None:
        raise error

    async def async_handler(event: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        raise error

    handler = async_handler if kind.startswith("async") else sync_handler
    events = Events()
    recorder = Recorder(events, "job:complete")
    for name in ("job:start", "job:success", "job:complete", "worker:getJob:empty"):
        events.on(name, handler)

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events) as runner:
        for n in range(3):
            await runner.add_job("t", {"n": n})
            await recorder.wait_for("job:complete", n + 1)
        assert not runner._task.done()
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert any("of the event 'job:start' raised; ignored" in r.getMessage() for r in caplog.records)


async def test_async_handlers_have_run_when_stop_returns(db: str) -> None:
    """``await runner.stop()`` returns after the async handlers of every event,
    ``pool:release`` and ``stop`` included, have finished."""
    finished: list[str] = []

    async def slow_handler(event: dict[str, Any]) -> None:
        await asyncio.sleep(0.2)
        finished.append(event["event"])

    events = Events()
    for name in ("pool:release", "stop"):
        events.on(name, slow_handler)

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, events=events):
        pass
    assert sorted(finished) == ["pool:release", "stop"]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


async def test_an_exception_that_cannot_be_printed_fails_only_its_job(
    utils: WorkerUtils, db: str
) -> None:
    events = Events()
    recorder = Recorder(events, "job:error", "job:success")

    async def t(payload: Any, helpers: Helpers) -> None:
        if payload["bad"]:
            raise _Unprintable()

    async with worker(db, {"t": t}, events=events) as runner:
        bad = await runner.add_job("t", {"bad": True})
        await recorder.wait_for("job:error")
        await runner.add_job("t", {"bad": False})
        await recorder.wait_for("job:success")
    [job] = rows(db, "select id, last_error, locked_by from graphile_worker._private_jobs")
    assert job == {
        "id": bad.id,
        "last_error": "_Unprintable: <unprintable _Unprintable object>",
        "locked_by": None,
    }


async def test_a_batch_result_of_the_wrong_length_is_a_success_with_a_warning(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As graphile-worker does: the whole job succeeds, and the bug is logged."""
    job = await utils.add_job("batch", [1, 2, 3])

    async def batch(payload: list[int], helpers: Helpers) -> list[Any]:
        return [None, ValueError("two")]  # two results for three items

    caplog.set_level(logging.INFO)
    events = Events()
    recorder = Recorder(events, "job:complete")
    async with worker(db, {"batch": batch}, events=events):
        await recorder.wait_for("job:complete")
    await _wait_for_empty_queue(db)
    [warning] = [r for r in caplog.records if "returned a list of 2 result(s)" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"(job {job.id})" in warning.getMessage()
    assert "payload of 3 item(s)" in warning.getMessage()
