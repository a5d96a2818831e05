"""``python -m worker_cli``: the same as the ``graphile-worker`` command."""

from .cli.commands import main

main()
