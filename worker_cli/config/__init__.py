"""Configuration: every setting and its default, and where values come from.

``options`` (``WorkerOptions``: the one place defaults live, and how each is
given on the command line), ``database`` (the connection string, the schema
and ``.env``), ``file`` (the TOML configuration file, checked key by key),
``zones`` (IANA time zones by name, for cron).

Layer: the bottom, with ``errors``. It imports nothing of the package but
``errors``.
"""
