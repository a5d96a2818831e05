"""What a client calls: adding, waiting for and administering jobs.

``worker_utils`` and ``sync_worker_utils`` (the async facade and its sync
twin, generated from it by ``tools/async_to_sync.py``: ``add_job``, the admin
functions, pauses and limits), ``utils_plans`` (what each of their methods
does, once for both), ``job_plans`` (plans of the job statements and the
decoding of their rows), ``admin_batches`` (the admin actions in bounded
batches), ``job_options`` (a job's own options, written beside it),
``trace_context`` (the trace context carried beside a job), ``job_waiting``
(``wait_for_job``'s rules, and the LISTEN connection serving a utilities
object's waiters: an asyncio task, or a thread) with ``async_waiting`` and
``sync_waiting`` (the wait loop, and its generated twin).

Layer: above ``jobs``; it never imports ``tasks``, ``observe``, ``worker``,
``dashboard`` or the entry points.
"""
