"""OpenTelemetry traces: a span per job run, child of the span that added the job.

The spans go to the SDK's in-memory exporter. The trace context travels
beside the job (``_private_py_job_trace_contexts``), never in its payload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from dbhelpers import rows, value
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from workers import until, worker

from worker_cli import Helpers, WorkerUtils
from worker_cli.client import trace_context
from worker_cli.observe.otel import propagate_trace_context

pytestmark = pytest.mark.db

CONTEXTS = "graphile_worker._private_py_job_trace_contexts"
JOBS = "graphile_worker._private_jobs"

_exporter = InMemorySpanExporter()


def _provider() -> None:
    """The process's TracerProvider (OpenTelemetry lets it be set once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans ended during the test; propagation is off again afterwards."""
    _provider()
    _exporter.clear()
    try:
        yield _exporter
    finally:
        propagate_trace_context(False)


tracer = trace.get_tracer("tests")


def finished(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def wait_for_spans(exporter: InMemorySpanExporter, name: str, count: int = 1) -> None:
    await until(lambda: len(finished(exporter, name)) >= count, what=f"{count} span(s) {name!r}")


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def inside_child(kind: str) -> Any:
    """A task (async or plain) that makes a span of its own, ``inside``."""
    if kind == "async":

        async def task(payload: Any, helpers: Helpers) -> None:
            with tracer.start_as_current_span("inside"):
                await asyncio.sleep(0)

        return task

    def plain(payload: Any, helpers: Helpers) -> None:
        with tracer.start_as_current_span("inside"):
            pass

    return plain


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_the_job_span_is_the_child_of_the_caller_and_the_parent_of_the_tasks_spans(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str, kind: str
) -> None:
    """A request adds a job from another process's WorkerUtils (here: the
    fixture's own pool): one trace, request -> process t -> inside."""
    async with worker(db, {"t": inside_child(kind)}, tracing=True):
        with tracer.start_as_current_span("request") as request:
            job = await utils.add_job("t", {"a": 1}, queue_name="q")
        await wait_for_spans(spans, "inside")
    [run] = finished(spans, "process t")
    [inside] = finished(spans, "inside")
    [caller] = finished(spans, "request")
    assert run.context.trace_id == caller.context.trace_id == inside.context.trace_id
    assert parent_id(run) == request.get_span_context().span_id
    assert parent_id(inside) == run.context.span_id
    assert run.kind is SpanKind.CONSUMER
    assert run.status.status_code is StatusCode.UNSET
    assert dict(run.attributes or {}) == {
        "messaging.system": "graphile_worker",
        "messaging.operation.type": "process",
        "messaging.destination.name": "t",
        "messaging.message.id": str(job.id),
        "graphile_worker.job.attempts": 1,
        "graphile_worker.job.max_attempts": 25,
        "graphile_worker.job.queue_name": "q",
    }


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_failed_job_has_the_error_status_and_the_exception(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str, kind: str
) -> None:
    if kind == "async":

        async def boom(payload: Any, helpers: Helpers) -> None:
            raise ValueError("boom")

    else:

        def boom(payload: Any, helpers: Helpers) -> None:
            raise ValueError("boom")

    async with worker(db, {"boom": boom}, tracing=True):
        await utils.add_job("boom", max_attempts=1)
        await wait_for_spans(spans, "process boom")
    [run] = finished(spans, "process boom")
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "ValueError: boom"
    [event] = run.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "ValueError"
    assert dict(event.attributes or {})["exception.message"] == "boom"
    assert parent_id(run) is None  # added without a current span: a trace of its own


async def test_a_batch_job_with_failed_items_has_the_error_status(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    async def batch(payload: list[int], helpers: Helpers) -> list[Any]:
        return [None if item else ValueError(f"item {item}") for item in payload]

    async with worker(db, {"batch": batch}, tracing=True):
        await utils.add_job("batch", [1, 0, 2], max_attempts=1)
        await wait_for_spans(spans, "process batch")
    [run] = finished(spans, "process batch")
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "Batch failures (1 of 3 items)"
    assert [dict(e.attributes or {})["exception.message"] for e in run.events] == ["item 0"]


async def test_a_job_added_without_a_trace_starts_its_own_whatever_is_current_in_the_worker(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    """A job added from SQL has no parent, even though the worker was started
    inside a span (its slots inherit that span's context)."""

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    with tracer.start_as_current_span("startup"):
        async with worker(db, {"t": t}, tracing=True):
            rows(db, "select graphile_worker.add_job('t')")
            await wait_for_spans(spans, "process t")
    [run] = finished(spans, "process t")
    assert parent_id(run) is None


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_a_job_added_by_a_task_is_the_child_of_that_tasks_span(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str, kind: str
) -> None:
    if kind == "async":

        async def first(payload: Any, helpers: Helpers) -> None:
            await helpers.add_job("second")

    else:

        def first(payload: Any, helpers: Helpers) -> None:
            helpers.run(helpers.add_job("second"))

    async def second(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"first": first, "second": second}, tracing=True):
        with tracer.start_as_current_span("request"):
            await utils.add_job("first")
        await wait_for_spans(spans, "process second")
    [one] = finished(spans, "process first")
    [two] = finished(spans, "process second")
    [caller] = finished(spans, "request")
    assert parent_id(one) == caller.context.span_id
    assert parent_id(two) == one.context.span_id
    assert two.context.trace_id == caller.context.trace_id


async def test_the_payload_is_left_as_it_was_added_and_the_context_travels_beside_it(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    """What a Node worker reads of the job is exactly what was added; the
    context is in the Python-only table, keyed by the job's id."""
    payload = {"to": "a@b.c", "items": [1, 2, {"x": None}]}
    plain = await utils.add_job("email", payload)
    propagate_trace_context()
    with tracer.start_as_current_span("request") as request:
        traced = await utils.add_job("email", payload)
        [batch] = await utils.add_jobs([{"identifier": "email", "payload": payload}])
    stored = {
        r["id"]: r["payload"]
        for r in rows(db, "select id, payload::text as payload from graphile_worker._private_jobs")
    }
    compact = json.dumps(payload, separators=(",", ":"))
    assert stored[traced.id] == stored[batch.id] == stored[plain.id] == compact
    carried = {r["job_id"]: r["context"] for r in rows(db, f"select * from {CONTEXTS}")}
    assert set(carried) == {traced.id, batch.id}
    context = request.get_span_context()
    flags = f"{context.trace_flags:02x}"
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags}"
    assert carried[traced.id] == carried[batch.id] == {"traceparent": traceparent}


async def test_propagation_needs_a_current_span_and_the_switch(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    with tracer.start_as_current_span("request"):
        await utils.add_job("t")  # propagation off
    propagate_trace_context()
    await utils.add_job("t")  # no current span
    assert value(db, f"select count(*) from {CONTEXTS}") == 0
    assert trace_context.carry("select 1") == ("select 1", {})


async def test_a_job_replaced_through_its_key_without_a_span_loses_the_old_context(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    """The latest call is the job's: replaced with no span current, the job no
    longer carries the first caller's context (it would become that trace's
    child); replaced under a span, it carries that one."""
    propagate_trace_context()
    for add in ("add_job", "add_jobs"):
        key = f"nightly-{add}"

        async def added(key: str = key, add: str = add) -> None:
            if add == "add_job":
                await utils.add_job("t", {"n": 1}, job_key=key)
            else:
                await utils.add_jobs([{"identifier": "t", "payload": {"n": 1}, "job_key": key}])

        with tracer.start_as_current_span("first"):
            await added()
        job_id = value(db, f"select id from {JOBS} where key = %s", (key,))
        contexts = f"select count(*) from {CONTEXTS} where job_id = %s"
        assert value(db, contexts, (job_id,)) == 1
        await added()  # no span current
        assert value(db, contexts, (job_id,)) == 0, add
        with tracer.start_as_current_span("third") as third:
            await added()
        [carried] = rows(db, f"select context from {CONTEXTS} where job_id = %s", (job_id,))
        assert f"{third.get_span_context().span_id:016x}" in carried["context"]["traceparent"]
    # A keyless add with no span current is sent as it is: nothing to forget.
    assert trace_context.carry("select 1") == ("select 1", {})


async def test_a_unique_conflict_leaves_the_existing_jobs_context(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    propagate_trace_context()
    with tracer.start_as_current_span("first") as first:
        added = await utils.add_job("t", {"n": 1}, unique={"period": 600})
    with tracer.start_as_current_span("second"):
        refused = await utils.add_job("t", {"n": 1}, unique={"period": 600})
    assert refused.conflict and refused.job_id == added.job_id
    [carried] = rows(db, f"select context from {CONTEXTS}")
    assert f"{first.get_span_context().span_id:016x}" in carried["context"]["traceparent"]


async def test_add_jobs_with_unique_carries_the_context_of_each_job_it_adds(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    """Every job a unique add_jobs adds carries the caller's context; one it
    refuses keeps the existing job's; the results keep the specs' order."""
    propagate_trace_context()
    with tracer.start_as_current_span("first") as first:
        [kept] = await utils.add_jobs(
            [{"identifier": "t", "payload": {"n": 1}}], unique={"period": 600}
        )
    with tracer.start_as_current_span("second") as second:
        results = await utils.add_jobs(
            [{"identifier": "t", "payload": {"n": n}} for n in (3, 1, 2)], unique={"period": 600}
        )
    assert [r.job.payload if r.job else None for r in results] == [{"n": 3}, {"n": 1}, {"n": 2}]
    assert [r.conflict for r in results] == [False, True, False]
    assert results[1].job_id == kept.job_id
    carried = {
        row["job_id"]: row["context"]["traceparent"]
        for row in rows(db, f"select job_id, context from {CONTEXTS}")
    }
    span_ids = {
        name: f"{span.get_span_context().span_id:016x}"
        for name, span in (("first", first), ("second", second))
    }
    assert set(carried) == {kept.job_id, results[0].job_id, results[2].job_id}
    assert span_ids["first"] in carried[kept.job_id]
    assert span_ids["second"] in carried[results[0].job_id]
    assert span_ids["second"] in carried[results[2].job_id]


async def test_contexts_are_deleted_once_their_job_succeeded_and_kept_for_retries(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str
) -> None:
    """A failed attempt keeps the context: the retry is a child of the same
    caller. After the success the row goes (at the worker's next fetch)."""
    attempts = 0

    async def flaky(payload: Any, helpers: Helpers) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("first attempt fails")

    async with worker(db, {"flaky": flaky, "other": flaky}, tracing=True):
        with tracer.start_as_current_span("request") as request:
            job = await utils.add_job("flaky")
        await wait_for_spans(spans, "process flaky")
        assert value(db, f"select count(*) from {CONTEXTS}") == 1
        await utils.reschedule_jobs([job.id], run_at=datetime.now(UTC))  # retry now
        await wait_for_spans(spans, "process flaky", 2)
        await utils.add_job("other")  # a fetch after the success
        await until(lambda: value(db, f"select count(*) from {CONTEXTS}") == 0)
    runs = finished(spans, "process flaky")
    assert [dict(r.attributes or {})["graphile_worker.job.attempts"] for r in runs] == [1, 2]
    assert [r.status.status_code for r in runs] == [StatusCode.ERROR, StatusCode.UNSET]
    assert {parent_id(r) for r in runs} == {request.get_span_context().span_id}


async def test_left_over_contexts_are_collected(
    spans: InMemorySpanExporter, utils: WorkerUtils, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows whose job is gone (completed by Node, by a worker without
    tracing) are deleted; those of live jobs stay."""
    monkeypatch.setattr(trace_context, "GARBAGE_INTERVAL", (0.0, 0.0))
    propagate_trace_context()
    with tracer.start_as_current_span("request"):
        later = await utils.add_job("t", run_at=datetime.now(UTC) + timedelta(hours=1))
        gone = await utils.add_job("t")
    await utils.complete_jobs([gone.id])  # as another worker would

    async def t(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"t": t}, tracing=True):
        await until(lambda: value(db, f"select count(*) from {CONTEXTS}") == 1)
    assert value(db, f"select job_id from {CONTEXTS}") == later.id


NODE_TASK = """\
module.exports = async (payload, helpers) => {
  await helpers.query("insert into public.seen (payload) values ($1)", [JSON.stringify(payload)]);
};
"""


@pytest.mark.node
async def test_a_node_worker_runs_a_traced_job_as_any_other_and_its_context_is_collected(
    spans: InMemorySpanExporter,
    utils: WorkerUtils,
    db: str,
    node: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "email.cjs").write_text(NODE_TASK)
    rows(db, "create table public.seen (payload json)")
    payload = {"to": "a@b.c", "n": [1, 2]}
    propagate_trace_context()
    with tracer.start_as_current_span("request"):
        await utils.add_job("email", payload)
    assert value(db, f"select count(*) from {CONTEXTS}") == 1
    result = node.run("-c", db, "--once", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [r["payload"] for r in rows(db, "select payload from public.seen")] == [payload]
    assert value(db, f"select count(*) from {JOBS}") == 0
    # Node left the context behind; a Python worker with tracing collects it.
    monkeypatch.setattr(trace_context, "GARBAGE_INTERVAL", (0.0, 0.0))

    async def other(payload: Any, helpers: Helpers) -> None:
        pass

    async with worker(db, {"other": other}, tracing=True):
        await until(lambda: value(db, f"select count(*) from {CONTEXTS}") == 0)
