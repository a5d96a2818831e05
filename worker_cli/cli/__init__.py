"""The command line: ``graphile-worker`` and its subcommands (click).

``commands`` holds the click commands, ``params`` what their options accept
(bounded numbers, schema names, ``--run-at``), ``run_config`` the
configuration file read the command's way for ``run()`` (``load_config``).

Layer: the top, with ``runner``. It may import every other part of the
package; nothing imports it but ``worker_cli/__init__.py`` (lazily) and
``__main__``.
"""

from __future__ import annotations

from .admin_commands import cancel, fail, jobs, migrate, remove, reschedule, retry
from .commands import command, main
from .job_commands import add_job, job
from .limit_commands import limit, limits
from .pause_commands import pause, pauses, resume
from .schedule_commands import schedule, schedules
from .workflow_commands import workflow, workflows

command.add_command(add_job)
command.add_command(job)
command.add_command(cancel)
command.add_command(pause)
command.add_command(resume)
command.add_command(pauses)
command.add_command(limit)
command.add_command(limits)
command.add_command(jobs)
command.add_command(retry)
command.add_command(reschedule)
command.add_command(fail)
command.add_command(remove)
command.add_command(migrate)
command.add_command(workflow)
command.add_command(workflows)
command.add_command(schedule)
command.add_command(schedules)

__all__ = ["command", "main"]
