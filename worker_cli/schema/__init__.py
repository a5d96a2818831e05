"""The schema: its SQL, installing and upgrading it, and cleaning it.

``statements`` (every SQL statement the package sends, composed with the
schema name; ``lifecycle`` those of the job lifecycle, ``ledger`` the history's
expiry ledger), ``migrate`` (the migrator, a plan), ``probe`` ("is the schema
installed?"), ``cleanup`` (the cleanup tasks).

Layer: above ``db``; it never imports ``jobs``, ``tasks``, ``observe``,
``worker``, ``dashboard`` or the entry points.
"""
