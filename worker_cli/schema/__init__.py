"""The schema: installing and upgrading it, and cleaning it.

``migrate`` (the migrator, a plan), ``probe`` ("is the schema installed?"),
``cleanup`` (the cleanup tasks), ``channels`` (the NOTIFY channels of the job
lifecycle). Every SQL statement lives in ``worker_cli.sql``.

Layer: above ``db``; it never imports ``jobs``, ``client``, ``tasks``, ``observe``,
``worker``, ``dashboard`` or the entry points.
"""
