"""Task `flaky`: fails on its first attempts, then succeeds (retries at work).

SELECT graphile_worker.add_job('flaky', '{"failures": 2}');

Raising an exception fails the attempt: its text goes into the job's
`last_error` and the job runs again after exp(attempts) seconds (about 3 s,
then 7 s, ...) until `max_attempts` (25 unless given) is used up.
`helpers.job.attempts` counts the attempts, this one included.
"""

from typing import Any

from worker_cli import Helpers


async def task(payload: dict[str, Any], helpers: Helpers) -> None:
    attempt, failures = helpers.job.attempts, payload.get("failures", 2)
    if attempt <= failures:
        raise RuntimeError(f"simulated failure on attempt {attempt} of {helpers.job.max_attempts}")
    helpers.logger.info(f"succeeded on attempt {attempt}")
