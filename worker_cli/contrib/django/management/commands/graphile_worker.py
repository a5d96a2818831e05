"""``python manage.py graphile_worker``: see :mod:`worker_cli.contrib.django.command`."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...command import command


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the Django Tasks enqueued through graphile-worker (GraphileWorkerBackend)."

    def run_from_argv(self, argv: list[str]) -> None:
        """The worker's own command line (click) instead of argparse's: the
        same flags as ``graphile-worker``. The system checks run first."""
        self.check()
        command.main(
            args=argv[2:], prog_name=f"{os.path.basename(argv[0])} {argv[1]}", standalone_mode=True
        )

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError(
            "graphile_worker runs from the command line: python manage.py graphile_worker "
            "[OPTIONS] (call_command cannot pass its flags)"
        )
