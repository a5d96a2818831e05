"""Prometheus metrics (the ``metrics`` extra), for library use:
``worker_cli.metrics.serve_metrics``. The implementation is
:mod:`worker_cli.observe.prometheus`."""

from __future__ import annotations

from .observe.prometheus import (
    DURATION_BUCKETS,
    MetricsServer,
    WorkerMetrics,
    attach_metrics,
    serve_metrics,
)

__all__ = ["DURATION_BUCKETS", "MetricsServer", "WorkerMetrics", "attach_metrics", "serve_metrics"]
