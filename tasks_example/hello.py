"""Task `hello`: greets the name in its payload.

SELECT graphile_worker.add_job('hello', '{"name": "Bobby Tables"}');
"""

from typing import Any

from worker_cli import Helpers


async def task(payload: dict[str, Any], helpers: Helpers) -> None:
    helpers.logger.info(f"Hello, {payload.get('name', 'world')}!")
