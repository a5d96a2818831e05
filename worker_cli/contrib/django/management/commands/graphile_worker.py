"""``python manage.py graphile_worker``: see :mod:`worker_cli.contrib.django.command`."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ...command import command


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the Django Tasks enqueued through graphile-worker (GraphileWorkerBackend)."

    def run_from_argv(self, argv: list[str]) -> None:
        """The worker's own command line (click) instead of argparse's: the
        same flags as ``graphile-worker``. The system checks run first: each
        error is one line on stderr, and the command exits 1."""
        if not _checked():
            sys.exit(1)
        command.main(
            args=argv[2:], prog_name=f"{os.path.basename(argv[0])} {argv[1]}", standalone_mode=True
        )

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError(
            "graphile_worker runs from the command line: python manage.py graphile_worker "
            "[OPTIONS] (call_command cannot pass its flags)"
        )


def _checked() -> bool:
    """Run the system checks and print what they found, one line each: True
    if the worker may start. The schema is not looked for (``databases=[]``):
    the worker installs it as it starts."""
    try:
        issues = checks.run_checks(databases=[])
    except ImproperlyConfigured as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return False
    shown = [issue for issue in issues if not issue.is_silenced()]
    for issue in shown:
        print(_line(issue), file=sys.stderr)
    return not any(issue.is_serious() for issue in shown)


def _line(issue: checks.CheckMessage) -> str:
    kind = "Error" if issue.is_serious() else "Warning"
    where = f"{issue.obj}: " if issue.obj is not None else ""
    label = f" ({issue.id})" if issue.id else ""
    hint = f" {issue.hint}" if issue.hint else ""
    return " ".join(f"{kind}{label}: {where}{issue.msg}.{hint}".split())
