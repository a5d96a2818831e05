"""Configuration: every setting and its default, and where values come from.

``options`` (``WorkerOptions``: the one place defaults live, and how each is
given on the command line), ``database`` (the connection string, the schema
and ``.env``), ``file`` (the TOML configuration file, checked key by key).

Layer: the bottom, with ``errors``. It imports nothing of the package but
``errors``.
"""
