"""How the package talks to PostgreSQL.

``connections`` (timeouts, keepalives, prepared statements, application
names), ``plan`` (database work as generators that yield statements: no I/O)
and ``drivers`` (the sync and async runners of plans, the only I/O of the
utilities), ``given_connection`` and ``held_connection`` (a caller's own
connection, and the one a task holds), ``raw_json`` and ``timestamps``
(loaders: payloads unparsed, times outside Python's years), ``retry`` (the backoff every
retrying loop uses).

Layer: above ``config`` and ``sql``; it imports nothing of ``schema``, ``jobs``, ``client``,
``tasks``, ``observe``, ``worker``, ``dashboard`` or the entry points.
"""
