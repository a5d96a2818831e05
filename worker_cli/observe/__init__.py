"""Seeing what the worker does: logs, events, status, metrics, traces.

``logs`` and ``line_handler`` (log lines, and the handler that writes a loop
iteration's success lines together), ``debug_log``, ``events``, ``status``
(``graphile-worker status``), ``progress`` (the
``--once`` progress line), ``metrics`` and ``queue_depth`` (Prometheus),
``tracing`` (OpenTelemetry), ``pool_view`` (what they read of a pool).

Layer: above ``tasks``; imported by the worker, never the reverse: it never
imports ``worker`` (a pool is seen through ``pool_view.ObservedPool``),
``dashboard`` or the entry points.
"""
