"""Task `notify`: sends a batch of notifications. A list payload is a batch.

Jobs added with the same job key and list payloads are merged (the lists are
concatenated), so a burst of notifications becomes one job, run 10 s after
the first of them:

SELECT graphile_worker.add_job('notify', '[{"to": "ada@example.com", "text": "hi"}]',
    job_key := 'notify', job_key_mode := 'preserve_run_at',
    run_at := now() + interval '10 seconds');

Returning a list as long as the payload reports on each item: the items whose
entry is an exception are retried alone (the job keeps just those), the rest
are done.
"""

from typing import Any

from worker_cli import Helpers


async def task(payload: list[dict[str, Any]], helpers: Helpers) -> list[Exception | None]:
    results: list[Exception | None] = []
    for item in payload:
        if "@" not in item.get("to", ""):
            results.append(ValueError(f"cannot notify {item.get('to')!r}: not an email address"))
            continue
        helpers.logger.info(f"notify {item['to']}: {item['text']}")
        results.append(None)
    return results
