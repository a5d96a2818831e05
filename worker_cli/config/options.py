"""Settings of a running worker, with graphile-worker's defaults.

This is the one place the defaults live: :class:`WorkerOptions` declares them,
``run()``'s keyword arguments take them from its fields, and :data:`FLAGS`
says how the fields that have a command-line flag are given there (the CLI
builds its click options from it, with the field's default).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeAlias

from .zones import zone_named

__all__ = [
    "FLAGS",
    "MAX_BATCH_DELAY",
    "MAX_CONCURRENCY",
    "MAX_HEARTBEAT_INTERVAL",
    "MAX_HEARTBEAT_TIMEOUT",
    "MAX_LOCAL_QUEUE_SIZE",
    "MAX_POLL_INTERVAL",
    "MAX_POOL_SIZE",
    "MAX_RESULT_BYTES",
    "MAX_TIMEOUT_GRACE",
    "Flag",
    "ForbiddenFlags",
    "WorkerOptions",
]

#: A fixed list of flags, or a function (sync or async) called before each fetch.
ForbiddenFlags: TypeAlias = (
    Sequence[str]
    | Callable[[], Sequence[str] | None]
    | Callable[[], Awaitable[Sequence[str] | None]]
    | None
)

# The most each numeric setting accepts (in the fields' units: seconds for
# times). Beyond these a value is absurd, or overflows where it is used: each
# slot is an asyncio task (a --once run with -j 100000 took 3 s and 320 MB
# before it could fetch a job, -j 1000000 31 s and 2.8 GB); the fetch's limit
# (idle slots plus the local queue) and the heartbeat's concurrency are
# PostgreSQL integers; a heartbeat's timeout becomes a timedelta and an interval.
#: Slots (``-j``).
MAX_CONCURRENCY = 10_000
#: Connections (``-m``): PostgreSQL's max_connections can be no higher.
MAX_POOL_SIZE = 262_143
#: Jobs held ahead (``--local-queue-size``).
MAX_LOCAL_QUEUE_SIZE = 100_000
#: Seconds between polls (``--poll-interval``, an hour).
MAX_POLL_INTERVAL = 3600
#: Seconds a batch of results may wait (``--complete-job-batch-delay``).
MAX_BATCH_DELAY = 10
#: Seconds: the longest --local-queue-horizon (the field also takes math.inf).
MAX_LOCAL_QUEUE_HORIZON = 60
#: Seconds between heartbeats (``--heartbeat-interval``, an hour).
MAX_HEARTBEAT_INTERVAL = 3600
#: Seconds of silence before a pool is declared dead (``--heartbeat-timeout``, a day).
MAX_HEARTBEAT_TIMEOUT = 86_400
#: Seconds a pool's session sign may be missing (``--session-grace``, an hour).
MAX_SESSION_GRACE = 3600
#: Bytes of a result kept (64 MiB: every result is written with its batch).
MAX_RESULT_BYTES = 64 << 20
#: Seconds a job may run past its timeout before it is stuck (``--timeout-grace``, a day).
MAX_TIMEOUT_GRACE = 86_400


#: The values of ``job_logs`` (``--job-logs``).
JOB_LOGS_CHOICES = ("failed", "all", "off")


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
    #: A connection string for the LISTEN connection alone (``--listen-url``):
    #: a direct one to PostgreSQL when the main one goes through a pooler in
    #: transaction mode, which cannot pass notifications on. None: the main one.
    listen_url: str | None = None
    #: Jobs carrying any of these flags are not fetched.
    forbidden_flags: ForbiddenFlags = None
    #: Most jobs fetched ahead and held locally, beyond the idle slots. The
    #: pool holds about ``local_queue_horizon`` seconds of work at its current
    #: completion rate, up to this many; 0 fetches only for idle slots. A
    #: crashed worker holds at most this many jobs plus the running ones.
    #: (1,000 until 2026-12: a one-process drain of trivial jobs ran 1.27x as
    #: fast with 4,000, in fewer, larger fetches; docs/performance.md.)
    local_queue_size: int = 4000
    #: Seconds of work (at the measured rate) the local queue aims to hold;
    #: ``math.inf`` keeps it always full. (0.05 until 2026-12: each of a fleet
    #: of workers, finishing a few thousand jobs a second, then fetched a few
    #: dozen at a time, and 16 processes drained at 0.67x the rate of the best
    #: count; 0.2 had them at 0.86-0.89x, 0.5 at 0.93x; docs/performance.md,
    #: "A fleet".)
    local_queue_horizon: float = 0.5
    #: Seconds a batch of job results may wait for more results to join it
    #: while the pool is busy (one statement and one commit for all of them);
    #: 0 writes whatever has finished as soon as the previous write is done.
    #: Results are written without this delay when the pool has nothing else
    #: to run and for jobs of named queues. (2 ms until 2026-12: each write of
    #: a busy pool of few slots then woke its event loop in its short jobs'
    #: waits; docs/performance.md, "Turnaround at low concurrency".)
    complete_job_batch_delay: float = 0.01
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
    #: heartbeats off. See ``worker_cli.worker.background.heartbeat``.
    heartbeat_interval: float | None = 30.0
    #: Seconds without a heartbeat after which any live pool with heartbeats on
    #: declares this pool dead and releases its jobs (``--heartbeat-timeout``):
    #: ten missed beats, well above a stall of the process, a database
    #: failover or a short network outage.
    heartbeat_timeout: float = 300.0
    #: Seconds a pool's session may be gone before the others declare it dead
    #: (``--session-grace``): a pool holds an advisory lock on its heartbeat's
    #: connection (its *session sign*), which a killed process loses at once,
    #: and this is the time a living pool has to connect again and take it
    #: back. 0 turns the sign off: only ``heartbeat_timeout`` declares a pool
    #: dead. See ``worker_cli.worker.background.session_sign``.
    session_grace: float = 5.0
    #: Use this process's clock instead of the database's ``now()`` (graphile-
    #: worker's ``useNodeTime``): for which jobs are due and the time their
    #: locks are taken at (the fetch), for the stale-lock sweep, and as the
    #: ``run_at`` of jobs added through the pool (``helpers.add_job``,
    #: ``runner.add_job``) without one (``--use-local-time``).
    use_local_time: bool = False
    #: Record each job a Python worker completes in the history, with its
    #: result, so ``get_job_result`` and ``wait_for_job`` can read it
    #: (``--history on|off``). Cancelled jobs are recorded either way.
    history: bool = True
    #: How long the history of a succeeded job is kept, fixed when its row is
    #: written (cancelled jobs are kept a day, archived failed ones a week).
    keep_succeeded: timedelta = timedelta(days=1)
    #: The largest result kept, in bytes of JSON; a larger one is not kept
    #: (the job still succeeds, and its record says why).
    max_result_bytes: int = 1 << 20
    #: Seconds between two prunings of expired history: a random value in this range.
    history_prune_interval: tuple[float, float] = (60.0, 120.0)
    #: Seconds between two reads of the cancel requests while jobs run (the
    #: safety net for a lost notification).
    cancel_poll_interval: float = 5.0
    #: Seconds after its cancel request after which a job still running is
    #: reported (it ignores the request).
    cancel_grace: float = 30.0
    #: Seconds after its timeout after which a job still running is stuck: it
    #: is reported, and its task's ``on_stuck`` applies (``--timeout-grace``).
    timeout_grace: float = 30.0
    #: Locks this pool holds that are older than this are taken again (their
    #: ``locked_at`` set to now), so that no 4-hour stale-lock sweep, Node's or
    #: ours, releases a job that runs longer; looked at about every half of it.
    lock_refresh_age: timedelta = timedelta(hours=1)
    #: The IANA time zone of the crontab lines without ``?tz=``
    #: (``--cron-timezone``); UTC, as graphile-worker (Node) runs every line.
    cron_timezone: str = "UTC"
    #: Which attempts keep the lines their task logged through
    #: ``helpers.logger`` (``--job-logs``): ``failed`` ones (written with the
    #: failure: a success costs nothing), ``all``, or none (``off``).
    job_logs: str = "failed"
    #: Child processes for the jobs of ``process=True`` tasks (``--processes``):
    #: None, one per CPU; never more than ``concurrency``. Started only when a
    #: task has ``process=True``.
    processes: int | None = None

    def __post_init__(self) -> None:
        zone_named(self.cron_timezone)  # ValueError naming an unknown zone
        if self.job_logs not in JOB_LOGS_CHOICES:
            raise ValueError(
                f"job_logs is {self.job_logs!r}; expected one of {', '.join(JOB_LOGS_CHOICES)}"
            )
        _check_range("concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        _check_range("poll_interval", self.poll_interval, 0, MAX_POLL_INTERVAL, "s", low_open=True)
        _check_range("max_pool_size", self.max_pool_size, 2, MAX_POOL_SIZE)
        _check_range("local_queue_size", self.local_queue_size, 0, MAX_LOCAL_QUEUE_SIZE)
        if not self.local_queue_horizon >= 0:  # math.inf keeps the queue full
            raise ValueError(
                f"local_queue_horizon must be 0s or more, not {self.local_queue_horizon!r}"
            )
        _check_range(
            "complete_job_batch_delay", self.complete_job_batch_delay, 0, MAX_BATCH_DELAY, "s"
        )
        _check_range("max_result_bytes", self.max_result_bytes, 0, MAX_RESULT_BYTES)
        if not self.forced_shutdown_timeout >= 0:
            raise ValueError("forced_shutdown_timeout must not be negative")
        _check_range("timeout_grace", self.timeout_grace, 0, MAX_TIMEOUT_GRACE, "s")
        if self.processes is not None:
            _check_range("processes", self.processes, 1, MAX_CONCURRENCY)
        if not timedelta(0) < self.lock_refresh_age < timedelta(hours=4):
            raise ValueError(
                f"lock_refresh_age must be more than 0 and less than 4 hours (the stale-lock "
                f"sweeps' age), not {self.lock_refresh_age}"
            )
        if self.heartbeat_interval:
            _check_range(
                "heartbeat_interval",
                self.heartbeat_interval,
                0,
                MAX_HEARTBEAT_INTERVAL,
                "s",
                low_open=True,
            )
            _check_range(
                "heartbeat_timeout",
                self.heartbeat_timeout,
                0,
                MAX_HEARTBEAT_TIMEOUT,
                "s",
                low_open=True,
            )
            _check_range("session_grace", self.session_grace, 0, MAX_SESSION_GRACE, "s")
            if not self.heartbeat_timeout >= 2 * self.heartbeat_interval:
                raise ValueError(
                    f"heartbeat_timeout ({self.heartbeat_timeout:g}s) must be at least twice "
                    f"heartbeat_interval ({self.heartbeat_interval:g}s)"
                )


def _check_range(
    name: str, value: float, low: float, high: float, unit: str = "", *, low_open: bool = False
) -> None:
    """A ValueError naming the field and its range if ``value`` is outside it
    (NaN is outside every range)."""
    above_low = value > low if low_open else value >= low
    if not (above_low and value <= high):
        bounds = (
            f"more than {low:g}{unit} and at most {high:g}{unit}"
            if low_open
            else f"from {low:g}{unit} to {high:g}{unit}"
        )
        raise ValueError(f"{name} must be {bounds}, not {value!r}")


@dataclass(frozen=True)
class Flag:
    """How one :class:`WorkerOptions` field is given on the command line.

    The flag's default is the field's, in the flag's unit; ``low``/``high``
    bound what the flag accepts (as the field's validation does).
    """

    #: The WorkerOptions field (and ``run()`` keyword) the flag sets.
    field: str
    #: The flag's spellings, e.g. ``("-j", "--jobs")``.
    names: tuple[str, ...]
    help: str
    envvar: str | None = None
    metavar: str | None = None
    #: Flag units per field unit: 1000 for a flag in milliseconds of a field
    #: in seconds.
    scale: int = 1
    #: Whole numbers only (else any number).
    whole: bool = True
    low: int | None = None
    high: int | None = None
    #: ``low`` itself is not accepted.
    low_open: bool = False
    #: The values the flag takes (None: any, within low/high).
    choices: tuple[str, ...] | None = None

    @property
    def switch(self) -> bool:
        """A field that is on by default: its flag takes ``on`` or ``off``."""
        return getattr(WorkerOptions(), self.field) is True

    @property
    def default(self) -> Any:
        """The field's default, in the flag's unit."""
        value = getattr(WorkerOptions(), self.field)
        if value is True:
            return "on"
        if self.scale == 1:
            return value
        scaled = value * self.scale
        return round(scaled) if self.whole else scaled

    def to_field(self, value: Any) -> Any:
        """A value given to the flag, in the field's unit."""
        if self.switch:
            return value in (True, "on")
        return value if self.scale == 1 else value / self.scale


#: The WorkerOptions fields that have a command-line flag, in ``--help`` order.
FLAGS: tuple[Flag, ...] = (
    Flag(
        "schema",
        ("-s", "--schema"),
        envvar="GRAPHILE_WORKER_SCHEMA",
        help="The schema graphile-worker's tables and functions live in.",
    ),
    Flag(
        "concurrency",
        ("-j", "--jobs"),
        low=1,
        high=MAX_CONCURRENCY,
        help="How many jobs to run at the same time.",
    ),
    Flag(
        "max_pool_size",
        ("-m", "--max-pool-size"),
        low=2,
        high=MAX_POOL_SIZE,
        help="Largest number of PostgreSQL connections in the pool.",
    ),
    Flag(
        "local_queue_size",
        ("--local-queue-size",),
        envvar="GRAPHILE_WORKER_LOCAL_QUEUE_SIZE",
        low=0,
        high=MAX_LOCAL_QUEUE_SIZE,
        help="Most jobs fetched ahead of free slots (--local-queue-horizon of work at the "
        "current rate is kept; 0: fetch only for idle slots). A crashed worker holds at most "
        "this many plus -j jobs until their locks expire.",
    ),
    Flag(
        "local_queue_horizon",
        ("--local-queue-horizon",),
        envvar="GRAPHILE_WORKER_LOCAL_QUEUE_HORIZON",
        metavar="MS",
        scale=1000,
        low=0,
        high=MAX_LOCAL_QUEUE_HORIZON * 1000,
        help="Milliseconds of work (at the rate jobs finish now) to fetch ahead of free "
        "slots, up to --local-queue-size jobs: more means fewer, larger fetches; less, "
        "that a worker holds fewer jobs other workers could run.",
    ),
    Flag(
        "complete_job_batch_delay",
        ("--complete-job-batch-delay",),
        envvar="GRAPHILE_WORKER_COMPLETE_JOB_BATCH_DELAY",
        metavar="MS",
        scale=1000,
        low=0,
        high=MAX_BATCH_DELAY * 1000,
        help="While the worker is busy, how long finished jobs may wait for others to be "
        "written back with them (one statement and one commit); 0: write as soon as "
        "the previous write is done.",
    ),
    Flag(
        "poll_interval",
        ("--poll-interval",),
        metavar="MS",
        scale=1000,
        low=1,
        high=MAX_POLL_INTERVAL * 1000,
        help="Milliseconds between polls for due jobs (scheduled jobs and retries) when idle.",
    ),
    Flag(
        "no_prepared_statements",
        ("--no-prepared-statements",),
        help="Do not use prepared statements (for pgBouncer in transaction mode).",
    ),
    Flag(
        "listen_url",
        ("--listen-url",),
        envvar="GRAPHILE_WORKER_LISTEN_URL",
        metavar="URL",
        help="Connection string of the LISTEN and heartbeat connections, when the main one "
        "goes through a pooler in transaction mode (PgBouncer), which gives neither a "
        "session of its own (notifications; the sign that a worker is alive): a direct "
        "one to PostgreSQL. Default: the main one.",
    ),
    Flag(
        "heartbeat_interval",
        ("--heartbeat-interval",),
        envvar="GRAPHILE_WORKER_HEARTBEAT_INTERVAL",
        metavar="SECONDS",
        whole=False,
        low=0,
        high=MAX_HEARTBEAT_INTERVAL,
        help="Record a heartbeat this often, and release the jobs of worker pools whose "
        "heartbeat stopped (crashed workers). 0 turns heartbeats off.",
    ),
    Flag(
        "heartbeat_timeout",
        ("--heartbeat-timeout",),
        envvar="GRAPHILE_WORKER_HEARTBEAT_TIMEOUT",
        metavar="SECONDS",
        whole=False,
        low=0,
        low_open=True,
        high=MAX_HEARTBEAT_TIMEOUT,
        help="A pool without a heartbeat for this long is declared dead by the others and "
        "its jobs run again; keep it well above any pause a worker may have (at least "
        "twice the interval).",
    ),
    Flag(
        "session_grace",
        ("--session-grace",),
        envvar="GRAPHILE_WORKER_SESSION_GRACE",
        metavar="SECONDS",
        whole=False,
        low=0,
        high=MAX_SESSION_GRACE,
        help="A pool whose database session is gone (its process was killed) for this "
        "long is declared dead by the others and its jobs run again; the time a living "
        "pool has to reconnect. 0: only --heartbeat-timeout declares a pool dead.",
    ),
    Flag(
        "timeout_grace",
        ("--timeout-grace",),
        envvar="GRAPHILE_WORKER_TIMEOUT_GRACE",
        metavar="SECONDS",
        whole=False,
        low=0,
        high=MAX_TIMEOUT_GRACE,
        help="A job still running this long after its timeout is stuck: it is reported, and "
        "its task's on_stuck applies (wait: it keeps its slot and lock; exit: the worker "
        "finishes its other jobs and exits with code 75).",
    ),
    Flag(
        "history",
        ("--history",),
        envvar="GRAPHILE_WORKER_HISTORY",
        help="on: record each job this worker completes, with its result, for "
        "get_job_result, wait_for_job, `graphile-worker job` and the dashboard (kept a "
        "day); off: delete completed jobs without a trace, as graphile-worker does. "
        "Cancelled jobs are recorded either way.",
    ),
    Flag(
        "cron_timezone",
        ("--cron-timezone",),
        envvar="GRAPHILE_WORKER_CRON_TIMEZONE",
        metavar="ZONE",
        help="The IANA time zone (Europe/Paris) of the crontab lines without ?tz=; daylight "
        "saving changes as Debian's cron. graphile-worker (Node) runs every line in UTC: "
        "do not let Node workers run a crontab meant for another zone.",
    ),
    Flag(
        "job_logs",
        ("--job-logs",),
        envvar="GRAPHILE_WORKER_JOB_LOGS",
        choices=JOB_LOGS_CHOICES,
        help="Which attempts keep the lines their task logged through helpers.logger "
        "(shown by `graphile-worker job ID --logs` and the dashboard): failed ones, all "
        "(a success writes them too), or off. At most 1,000 lines, 64 KiB, per attempt.",
    ),
    Flag(
        "processes",
        ("--processes",),
        envvar="GRAPHILE_WORKER_PROCESSES",
        metavar="N",
        low=1,
        high=MAX_CONCURRENCY,
        help="Child processes for the jobs of tasks declared with "
        "@task_options(process=True) (CPU-bound plain def tasks): default one per CPU, "
        "never more than -j. Started only when such a task is loaded.",
    ),
    Flag(
        "use_local_time",
        ("--use-local-time",),
        envvar="GRAPHILE_WORKER_USE_LOCAL_TIME",
        help="Use this machine's clock rather than the database's to decide which jobs are "
        "due, to time locks, and as the run_at of jobs added without one (graphile-worker's "
        "useNodeTime). Better: keep both clocks in sync.",
    ),
)
