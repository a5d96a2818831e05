"""``python -m worker_cli``: the same as the ``graphile-worker`` command."""

from .cli import main

main()
