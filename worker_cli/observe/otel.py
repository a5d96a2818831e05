"""OpenTelemetry traces of jobs (the ``otel`` extra: ``opentelemetry-api``).

``run(..., tracing=True)`` (``graphile-worker --tracing``) wraps each task
function once, at start-up, so that every run of a job is a span
(``process <task>``, kind CONSUMER) with the job's id, task, attempt and
queue as attributes, the error status and the exception on failure. The span
is the *current* span while the task runs: in the slot's asyncio task for an
``async def`` task, in the job's own ``contextvars`` context in the slot's
thread for a plain ``def`` one, so the spans a task makes (an instrumented
HTTP client, a database driver) are its children.

Its parent is the span that was current where ``add_job`` was called, when
that process had called :func:`propagate_trace_context` (a worker with
tracing on does so itself, so a job added by a task is a child of that
task's span). The context travels beside the job, never in its payload: see
:mod:`worker_cli.client.trace_context`. A job added from SQL, from Node, or without
a current span starts a trace of its own.

Only the API is used: where the spans go is the application's choice of SDK
and exporter (configured in code, or by running the worker under
``opentelemetry-instrument``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextvars import Token
from dataclasses import replace
from typing import Any

from .._version import __version__
from ..client.trace_context import JobContexts, set_injector
from ..errors import ConfigurationError
from ..extras import install_hint
from ..jobs.job import Job
from ..jobs.last_error import describe
from ..tasks.helpers import Helpers
from ..tasks.loader import Task

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError:
    raise ConfigurationError(
        "tracing needs the OpenTelemetry API: " + install_hint("otel")
    ) from None

__all__ = ["JobTracer", "propagate_trace_context", "trace_tasks"]

logger = logging.getLogger("graphile_worker.tracing")

#: The instrumentation scope of the spans.
TRACER_NAME = "graphile_worker"

#: The parent of a job that carried no trace context: none.
_EMPTY = Context()


def propagate_trace_context(enabled: bool = True) -> None:
    """From now on, ``add_job`` / ``add_jobs`` (WorkerUtils, ``quick_add_job``,
    ``helpers.add_job``) called in this process while a span is current store
    its trace context with each job they add, for the job's span to be its
    child (the globally configured propagator's carrier: W3C ``traceparent``
    by default). ``enabled=False`` stops it. ``add_jobs`` with ``unique`` does
    not carry it."""
    set_injector(propagate.inject if enabled else None)


def trace_tasks(tasks: Mapping[str, Task], schema: str) -> tuple[dict[str, Task], JobContexts]:
    """Tracing on for a worker: its tasks wrapped in spans, and the store of
    the trace contexts its fetches read (:meth:`JobContexts.load`, the
    fetcher's hook). Also turns on :func:`propagate_trace_context`."""
    propagate_trace_context()
    if not sdk_configured():
        logger.warning(
            "Tracing is on but no OpenTelemetry SDK is configured yet: spans go nowhere until "
            "a TracerProvider is set (in a task module, or run under opentelemetry-instrument)"
        )
    contexts = JobContexts(schema)
    tracer = JobTracer(contexts)
    return {name: tracer.wrap(task) for name, task in tasks.items()}, contexts


def sdk_configured() -> bool:
    """Whether a TracerProvider has been set (else every span is a no-op)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


class JobTracer:
    """Makes the span of each job run."""

    def __init__(self, contexts: JobContexts) -> None:
        self._contexts = contexts
        self._tracer = trace.get_tracer(TRACER_NAME, __version__)

    def wrap(self, task: Task) -> Task:
        """``task`` with its function run inside the job's span (async stays async).

        The span is started and made current by hand (a context variable set
        and reset) rather than through the API's context managers: three
        generator-based ones per job cost more than everything else here.
        """
        function = task.function
        name = f"process {task.identifier}"
        start, finished = self._start, self._finished

        if task.is_async:

            async def traced_async(payload: Any, helpers: Helpers) -> Any:
                job = helpers.job
                span, token, carried = start(name, job)
                try:
                    result = await function(payload, helpers)
                except BaseException as exc:
                    _failed(span, exc)
                    raise
                else:
                    finished(span, job, carried, result)
                    return result
                finally:
                    otel_context.detach(token)
                    span.end()

            return replace(task, function=traced_async)

        def traced(payload: Any, helpers: Helpers) -> Any:
            job = helpers.job
            span, token, carried = start(name, job)
            try:
                result = function(payload, helpers)
            except BaseException as exc:
                _failed(span, exc)
                raise
            else:
                finished(span, job, carried, result)
                return result
            finally:
                otel_context.detach(token)
                span.end()

        return replace(task, function=traced)

    def _start(self, name: str, job: Job) -> tuple[Span, Token[Context], bool]:
        """Start the job's span and make it current; returns it, the token
        that restores the previous context, and whether the job carried a
        parent. Without one it is a root span, whatever was current."""
        carrier = self._contexts.pop(job.id)
        parent = _EMPTY if carrier is None else propagate.extract(carrier, context=_EMPTY)
        span = self._tracer.start_span(name, parent, SpanKind.CONSUMER)
        if span.is_recording():
            span.set_attributes(job_attributes(job))
        # The parent's values (baggage) stay current too. Without an SDK the
        # span is the API's non-recording copy of the parent's: a client the
        # task calls still passes the caller's trace on.
        current = trace.set_span_in_context(span, parent)
        return span, otel_context.attach(current), carrier is not None

    def _finished(self, span: Span, job: Job, carried: bool, result: Any) -> None:
        """The task returned: a batch job whose result lists failures failed
        (it retries those items); any other job succeeded, and its context
        is no longer needed."""
        payload = job.payload
        if isinstance(result, list) and isinstance(payload, list) and len(result) == len(payload):
            failures = [entry for entry in result if isinstance(entry, BaseException)]
            if failures:
                for failure in failures:
                    span.record_exception(failure)
                span.set_status(
                    Status(
                        StatusCode.ERROR,
                        f"Batch failures ({len(failures)} of {len(result)} items)",
                    )
                )
                return
        if carried:
            self._contexts.succeeded(job.id)


def _failed(span: Span, error: BaseException) -> None:
    """The job failed (anything raised fails it, SystemExit included): the
    exception as an event, and the error status with the job's last_error."""
    if span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, describe(error)))


def job_attributes(job: Job) -> dict[str, str | int]:
    """A job's span attributes: its id and task as OpenTelemetry's messaging
    conventions name them, the rest under ``graphile_worker.job.*`` (few:
    each costs the SDK about a microsecond per job)."""
    attributes: dict[str, str | int] = {
        "messaging.system": "graphile_worker",
        "messaging.operation.type": "process",
        "messaging.destination.name": job.task_identifier,
        "messaging.message.id": str(job.id),
        "graphile_worker.job.attempts": job.attempts,
        "graphile_worker.job.max_attempts": job.max_attempts,
    }
    if job.queue_name is not None:
        attributes["graphile_worker.job.queue_name"] = job.queue_name
    return attributes
