"""Adding and administering jobs, and what a job is.

``worker_utils`` and ``sync_worker_utils`` (the async facade and its sync
twin, generated from it by ``tools/async_to_sync.py``: ``add_job``, the admin
functions, pauses and limits), ``utils_plans`` (what each of their
methods does, once for both), ``job_queries`` (plans of the job statements),
``job_spec`` and ``payloads`` (checking and encoding a job's options and
payload), ``unique`` (unique-job rules), ``job`` (``Job`` and the decoder of
job rows), ``results`` (a job's state and result), ``waiting`` (``wait_for_job``'s
rules, and the LISTEN connection serving a utilities object's waiters: an
asyncio task, or a thread) with ``async_waiting`` and ``sync_waiting`` (the wait
loop, and its generated twin), ``trace_context``
(the trace context carried beside a job), ``last_error`` (the text stored as
a job's ``last_error``), ``in_task`` (whether the caller runs in a job of this
process's worker: the names of the slots' tasks and threads).

Layer: above ``schema`` and ``db``; it never imports ``tasks``, ``observe``,
``worker``, ``dashboard`` or the entry points.
"""
