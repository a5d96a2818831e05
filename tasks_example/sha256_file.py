"""Task `sha256_file`: logs the SHA-256 of a file. Blocking work, in a thread.

SELECT graphile_worker.add_job('sha256_file', '{"path": "/etc/hostname"}');

A plain `def` (not `async def`) runs in one of the worker's threads, so
blocking calls (file I/O, hashing, a synchronous client library) do not hold
up the other jobs. From here, call a helper with `helpers.run(...)`.
"""

import hashlib
from pathlib import Path
from typing import Any

from worker_cli import Helpers


def task(payload: dict[str, Any], helpers: Helpers) -> None:
    digest = hashlib.sha256()
    with Path(payload["path"]).open("rb") as file:
        while chunk := file.read(1024 * 1024):
            # Set when the worker shuts down and its grace period is over.
            if helpers.abort_signal.is_set():
                raise RuntimeError("aborted: the worker is shutting down")
            digest.update(chunk)
    helpers.logger.info(f"sha256 {digest.hexdigest()}  {payload['path']}")
