"""The database's clock, as the CLI and the worker read it."""

from __future__ import annotations

# The database's now() (the transaction's start).
NOW = "select now()"

# The database's clock_timestamp(), in seconds since the epoch.
CLOCK_EPOCH = "select extract(epoch from clock_timestamp())::float8"
