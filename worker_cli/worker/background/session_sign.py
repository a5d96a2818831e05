"""A pool's session sign: a killed worker's jobs come back in seconds.

A process that dies on its host (SIGKILL, the OOM killer, a crash in a C
extension) loses its database sessions at once: the server sees each
connection close and ends its session within milliseconds. A pool uses that:
it holds a session-level advisory lock, ``(SIGN_CLASS, key)``, on its
heartbeat's connection for as long as it runs, and records the key in its
heartbeat row (migrations/py/000025.sql). At every tick of their heartbeats
(about a second) the other pools look for it in ``pg_locks``; a pool whose
sign has been missing for the grace *it* declared (``--session-grace``, 5 s)
is declared dead as a silent one is (``heartbeats_sql.HEARTBEAT_REAP``).
Only a host that vanishes (power, a network cut) leaves its sessions open on
the server until they time out; the heartbeat timeout stays the rule there.

No living pool is declared dead by its sign:

- a database restart or a failover ends every session and every lock: a sign
  counts only on the run of the server it was taken on (its
  ``pg_postmaster_start_time()`` is recorded), so until each pool has taken
  its sign again on the new run, only the heartbeat timeout applies to it;
- a connection lost and made again: the heartbeat's thread finds its
  connection broken at its next tick, connects again and takes its sign back,
  well within the grace (its reconnect waits start at 0.1 s);
- a stalled process (a long garbage collection, a blocked event loop, a
  stopped VM) keeps its sessions: the sign stays, and the heartbeat timeout
  judges the silence as before.

The key is random (second key of a two-key lock, first key ``"gwPs"``; no
one-key lock shares that space), taken with ``pg_try_advisory_lock`` so that
no two live pools of a database hold the same one.

The sign needs a session of the pool's own: not a pooler in transaction mode,
which runs each statement on whichever server connection it lends (and keeps
the lock there, on a connection that may outlive or predecease the pool).
With ``--no-prepared-statements`` (PgBouncer) the heartbeat connects through
``--listen-url``, the direct connection string the pool already has for
LISTEN; without one, the pool takes no sign and says so at start. And at
every tick a pool checks that its sign is held by the very session it talks
to; if not (an undeclared pooler), it drops the sign for good, with a warning.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import Any, ClassVar

import psycopg

from ...config.options import WorkerOptions
from ...sql import heartbeats as heartbeats_sql

__all__ = ["SIGN_CLASS", "SessionSign"]

logger = logging.getLogger("graphile_worker")

#: The first key of every pool's sign (``"gwPs"``); the second is the pool's own.
SIGN_CLASS = 0x67775073

#: Keys tried before giving up on a sign (each taken one belongs to a live pool).
_TRIES = 8


class SessionSign:
    """The sign of one pool, taken and held on its heartbeat's connection.

    Used from the heartbeat's thread only. :meth:`params` is what the beat
    records; ``None`` values there mean no sign (only the heartbeat timeout
    applies to this pool).
    """

    #: The beat's parameters of a pool without a sign.
    NONE: ClassVar[dict[str, Any]] = {
        "sign_key": None,
        "sign_server_start": None,
        "sign_grace": None,
    }

    def __init__(self, pool_id: str, grace: float, *, enabled: bool) -> None:
        self._pool_id = pool_id
        #: Seconds the sign may be missing before others declare the pool dead.
        self.grace = grace
        #: Whether this pool takes a sign at all (false: off, or no session of its own).
        self.enabled = enabled and grace > 0
        self.key: int | None = None
        self._server_start: datetime | None = None

    @classmethod
    def of_pool(cls, pool_id: str, options: WorkerOptions) -> SessionSign:
        """The sign of a pool run with ``options``; warns when it cannot have one."""
        grace = options.session_grace
        no_session = options.no_prepared_statements and not options.listen_url
        if grace > 0 and no_session:
            logger.warning(
                "Worker pool %s: --no-prepared-statements without --listen-url: the "
                "heartbeat has no session of its own, so a killed worker's jobs are "
                "released only after --heartbeat-timeout (%gs); give --listen-url a direct "
                "connection string to PostgreSQL to have them back within seconds",
                pool_id,
                options.heartbeat_timeout,
            )
        return cls(pool_id, grace, enabled=not no_session)

    @property
    def held(self) -> bool:
        return self.key is not None

    def take(self, conn: psycopg.Connection[Any]) -> None:
        """Take a sign on ``conn``, a connection just made (its previous sign,
        if any, went with its previous session). Database errors propagate."""
        self.key = None
        if not self.enabled:
            return
        for _ in range(_TRIES):
            key = secrets.randbelow(2**31 - 1) + 1
            params = {"sign_class": SIGN_CLASS, "key": key}
            row = conn.execute(heartbeats_sql.SIGN_TAKE, params).fetchone()
            assert row is not None
            taken, server_start, _pid = row
            if taken:
                self.key, self._server_start = key, server_start
                return
        logger.warning(
            "Worker pool %s: could not take a session sign (%d keys tried were all held); "
            "only --heartbeat-timeout will declare this pool dead",
            self._pool_id,
            _TRIES,
        )

    def drop(self, why: str) -> None:
        """Give up the sign for good (the next beat records none), with a warning."""
        if not self.enabled:
            return
        self.enabled = False
        self.key = None
        logger.warning(
            "Worker pool %s: %s; a killed worker's jobs are released only after "
            "--heartbeat-timeout from now on (give --listen-url a direct connection string "
            "to PostgreSQL)",
            self._pool_id,
            why,
        )

    def params(self) -> dict[str, Any]:
        """The beat's parameters for the sign (all None without one)."""
        if self.key is None:
            return self.NONE
        return {
            "sign_key": self.key,
            "sign_server_start": self._server_start,
            "sign_grace": timedelta(seconds=self.grace),
        }
