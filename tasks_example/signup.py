"""Task `signup`: a user signed up; their welcome is a follow-up job.

SELECT graphile_worker.add_job('signup', '{"name": "Ada", "email": "ada@example.com"}');

Tasks add jobs with `helpers.add_job` (the same options as WorkerUtils.add_job).
The job key makes the follow-up safe to add twice: if this job is retried
after adding it, the pending welcome is replaced, not doubled.
"""

from typing import Any

from worker_cli import Helpers


async def task(payload: dict[str, Any], helpers: Helpers) -> None:
    welcome = await helpers.add_job(
        "hello", {"name": payload["name"]}, job_key=f"welcome:{payload['email']}"
    )
    helpers.logger.info(f"{payload['email']} signed up; welcome queued as job {welcome.id}")
