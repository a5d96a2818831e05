"""The loops that run beside a pool's pipeline: ``loops`` (builds and owns
them), ``listener`` (LISTEN), ``pause_watch`` (pauses in force; jobs given
back), ``maintenance`` (the poller and the stale-lock sweeper), ``pruner``
(expired history), ``heartbeat`` (its own thread), ``session_sign`` (what a
killed pool loses at once), ``lock_refresh`` (long jobs keep their locks),
``cron_scheduler`` (due cron items)."""
