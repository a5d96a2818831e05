"""Tasks: what runs a job.

``loader`` (a ``tasks/`` folder or a ``task_list``, executable tasks),
``typed_tasks`` and ``payload_types`` (a task whose payload is typed, and the
JSON-to-type converter), ``helpers`` (what a task receives), ``crontab``
(the crontab parser).

Layer: above ``client``; it never imports ``observe``, ``worker``,
``dashboard`` or the entry points.
"""
