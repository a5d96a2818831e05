"""What a job is: its row, what a caller may ask of it, its state.

``job`` (``Job`` and the one decoder of job rows), ``job_spec`` and
``payloads`` (a job's options checked, its payload encoded), ``unique``
(unique-job rules and results), ``job_state`` (a job's state and result, as
any process reads them), ``last_error`` (the text stored as a job's
``last_error``), ``limit_spec`` and ``pause_spec`` (limits and pauses as the
utilities take and return them), ``text_args`` (text PostgreSQL can store),
``inside_worker`` (whether the caller runs in a job of this process's worker:
the names of the slots' tasks and threads). No I/O here.

Layer: above ``schema`` and ``db``; it never imports ``client``, ``tasks``,
``observe``, ``worker``, ``dashboard`` or the entry points.
"""
