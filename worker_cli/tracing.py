"""OpenTelemetry (the ``otel`` extra), for library use:
``from worker_cli.tracing import propagate_trace_context``. The
implementation is :mod:`worker_cli.observe.otel`."""

from __future__ import annotations

from .observe.otel import JobTracer, propagate_trace_context, trace_tasks

__all__ = ["JobTracer", "propagate_trace_context", "trace_tasks"]
