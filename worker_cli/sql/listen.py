"""The LISTEN channels and the listener's probe."""

from __future__ import annotations

# The listener's channels: add_job notifies "jobs:insert"; a migration
# notifies "worker:migrate" (breaking ones stop the pool).
LISTEN_JOBS_INSERT = 'listen "jobs:insert"'

LISTEN_WORKER_MIGRATE = 'listen "worker:migrate"'

# LISTEN on a channel of our own, an identifier: compose with
# ``sql.SQL(LISTEN).format(sql.Identifier(channel))``.
LISTEN = "listen {}"

# The listener's probe: a notification sent on another connection, to check
# that notifications arrive (%s: the channel, the token).
NOTIFY_PROBE = "select pg_notify(%s, %s)"
