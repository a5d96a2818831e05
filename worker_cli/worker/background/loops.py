"""The loops that run beside a pool's pipeline, built for it.

The listener (LISTEN: new jobs, cancel requests, pauses, breaking
migrations), the pause watch, the poller, the sweeper of stale locks, the
pruner of expired history, the cancel watch, cron, and (heartbeats off) the
refresh of long jobs' locks. With ``once`` only the cancel watch and that
refresh run (the watch then polls: there is no listener; the fetch still
leaves paused jobs alone).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...client.worker_utils import WorkerUtils
from ...config.options import WorkerOptions
from ...db.connections import WorkerConnections
from ...jobs.job import Job
from ...observe.events import Events
from ..pipeline.local_queue import LocalQueue
from ..pipeline.slots import Slots
from ..supervision.cancel_watch import CancelWatch
from ..supervision.stuck import StuckJobs
from .cron_scheduler import CronScheduler
from .listener import Listener
from .lock_refresh import LockRefresh
from .maintenance import Poller, Sweeper
from .pause_watch import Pauses, PauseSettings, PauseWatch
from .pruner import HistoryPruner
from .schedule_source import DatabaseSchedules
from .workflow_repair import WorkflowRepair

if TYPE_CHECKING:
    from ...jobs.crontab import ParsedCronItem

__all__ = ["PoolHooks", "background_loops"]


@dataclass(frozen=True)
class PoolHooks:
    """What the loops need of their pool."""

    options: WorkerOptions
    connections: WorkerConnections
    events: Events
    #: What the listener's events receive as ``pool``.
    owner: object
    once: bool
    cron_items: Sequence[ParsedCronItem]
    #: There may be new runnable jobs.
    nudge: Callable[[], None]
    #: The last fetch found fewer jobs than it asked for.
    exhausted: Callable[[], bool]
    on_breaking_migration: Callable[[str], None]
    #: The pool's stuck jobs (the cancel watch reports those that ignore a cancel).
    stuck: StuckJobs
    #: Refreshes the locks of long jobs on the loop (heartbeats off; else the
    #: heartbeat's thread does).
    lock_refresh: LockRefresh | None = None
    #: The pool's view of pauses, which the pause watch keeps current (not
    #: with ``once``: its fetches still leave paused jobs alone), giving back
    #: fetched jobs of paused queues and tasks from ``queue``.
    pauses: Pauses | None = None
    queue: LocalQueue | None = None
    give_back: Callable[[Sequence[Job]], Awaitable[None]] | None = None
    #: A limit may have changed (told on the same channel as pauses).
    limits_changed: Callable[[], None] = lambda: None


def background_loops(
    pool: PoolHooks, utils: WorkerUtils, slots: Slots
) -> list[Coroutine[Any, Any, None]]:
    """The loops of one pool (each a coroutine its task group runs and cancels)."""
    options = pool.options
    cancels = CancelWatch(
        utils,
        slots,
        schema=options.schema,
        pool_id=pool.connections.pool_id,
        stuck=pool.stuck,
        poll_interval=options.cancel_poll_interval,
        grace=options.cancel_grace,
    )
    refresh = [pool.lock_refresh.run(utils)] if pool.lock_refresh is not None else []
    if pool.once:
        return [cancels.run(), *refresh]
    pauses = None
    if pool.pauses is not None and pool.queue is not None and pool.give_back is not None:
        pauses = PauseWatch(
            utils.pool,
            pool.pauses,
            settings=PauseSettings(options.schema, options.poll_interval),
            queue=pool.queue,
            give_back=pool.give_back,
            nudge=pool.nudge,
            on_control=pool.limits_changed,
        )
    # Cron: the crontab's items, and the database's schedules (always: one
    # may be added at any time). A schedule without tz runs in UTC whatever
    # this worker's cron_timezone: every worker of the fleet must agree.
    schedules = DatabaseSchedules(utils.pool, options.schema, default_zone=None)
    listener = Listener(
        pool.connections,
        on_jobs=pool.nudge,
        on_breaking_migration=pool.on_breaking_migration,
        on_reconnected=utils.pool.check,
        events=pool.events,
        owner=pool.owner,
        schema=options.schema,
        on_cancel=cancels.notified,
        on_control=pauses.notified if pauses is not None else None,
        on_schedules=schedules.notified,
        probe_pool=utils.pool,
        poll_interval=options.poll_interval,
    )
    poller = Poller(options.poll_interval, exhausted=pool.exhausted, nudge=pool.nudge)
    sweeper = Sweeper(
        utils,
        schema=options.schema,
        stale_lock_timeout=options.stale_lock_timeout,
        interval=options.stale_sweep_interval,
        on_released=pool.nudge,
    )
    pruner = HistoryPruner(
        utils,
        schema=options.schema,
        interval=options.history_prune_interval,
        keep_succeeded=options.keep_succeeded,
    )
    repair = WorkflowRepair(utils.pool, schema=options.schema)
    loops = [
        listener.run(),
        poller.run(),
        sweeper.run(),
        pruner.run(),
        cancels.run(),
        repair.run(),
        *refresh,
    ]
    if pauses is not None:
        loops.append(pauses.run())
    loops.append(
        CronScheduler(
            pool.cron_items,
            utils.pool,
            options.schema,
            default_zone=options.cron_timezone,
            schedules=schedules,
        ).run()
    )
    return loops
