"""Settings of a running worker, with graphile-worker's defaults."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeAlias

__all__ = ["ForbiddenFlags", "WorkerOptions"]

#: A fixed list of flags, or a function (sync or async) called before each fetch.
ForbiddenFlags: TypeAlias = (
    Sequence[str]
    | Callable[[], Sequence[str] | None]
    | Callable[[], Awaitable[Sequence[str] | None]]
    | None
)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker pool runs; every field has the CLI's default."""

    #: Jobs run at the same time (``-j/--jobs``).
    concurrency: int = 1
    #: Schema of the graphile-worker tables (``-s/--schema``).
    schema: str = "graphile_worker"
    #: Seconds between polls for due jobs when idle (``--poll-interval`` / 1000).
    poll_interval: float = 2.0
    #: Largest size of the connection pool (``-m/--max-pool-size``).
    max_pool_size: int = 10
    #: Disable server-side prepared statements, for pgBouncer in transaction mode.
    no_prepared_statements: bool = False
    #: Jobs carrying any of these flags are not fetched.
    forbidden_flags: ForbiddenFlags = None
    #: Most jobs fetched ahead and held locally, beyond the idle slots. The
    #: pool holds about ``local_queue_horizon`` seconds of work at its current
    #: completion rate, up to this many; 0 fetches only for idle slots. A
    #: crashed worker holds at most this many jobs plus the running ones.
    local_queue_size: int = 200
    #: Seconds of work (at the measured rate) the local queue aims to hold;
    #: ``math.inf`` keeps it always full.
    local_queue_horizon: float = 0.05
    #: Seconds a batch of job results may wait for more results to join it
    #: while the pool is busy (one statement and one commit for all of them);
    #: 0 writes whatever has finished as soon as the previous write is done.
    #: Results are written without this delay when the pool has nothing else
    #: to run and for jobs of named queues.
    complete_job_batch_delay: float = 0.002
    #: Seconds to wait for running jobs on shutdown before setting abort_signal.
    graceful_shutdown_timeout: float = 5.0
    #: Seconds a forced shutdown (a second signal, ``force_stop()``) spends
    #: writing back results before it gives up on the database and ends,
    #: logging the ids of the jobs whose results were not written.
    forced_shutdown_timeout: float = 5.0
    #: Locks older than this are considered abandoned by a crashed worker.
    stale_lock_timeout: timedelta = timedelta(hours=4)
    #: Seconds between stale-lock sweeps: a random value in this range.
    stale_sweep_interval: tuple[float, float] = (480.0, 600.0)
    #: Log a line for every successful job (``NO_LOG_SUCCESS`` turns it off).
    log_success: bool = True
    #: Seconds between heartbeats (``--heartbeat-interval``); None or 0 turns
    #: heartbeats off. See ``worker_cli.worker.heartbeat``.
    heartbeat_interval: float | None = 30.0
    #: Seconds without a heartbeat after which any live pool with heartbeats on
    #: declares this pool dead and releases its jobs (``--heartbeat-timeout``):
    #: ten missed beats, well above a stall of the process, a database
    #: failover or a short network outage.
    heartbeat_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if self.max_pool_size < 2:
            raise ValueError("max_pool_size must be at least 2")
        if self.local_queue_size < 0:
            raise ValueError("local_queue_size must not be negative")
        if not 0 <= self.complete_job_batch_delay <= 10:
            raise ValueError("complete_job_batch_delay must be between 0 and 10 seconds")
        if not self.forced_shutdown_timeout >= 0:
            raise ValueError("forced_shutdown_timeout must not be negative")
        if self.heartbeat_interval:
            if not self.heartbeat_interval > 0:
                raise ValueError("heartbeat_interval must not be negative")
            if not self.heartbeat_timeout >= 2 * self.heartbeat_interval:
                raise ValueError(
                    f"heartbeat_timeout ({self.heartbeat_timeout:g}s) must be at least twice "
                    f"heartbeat_interval ({self.heartbeat_interval:g}s)"
                )
