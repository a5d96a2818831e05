"""Make the README's screenshot of the dashboard's overview.

    python tests/dashboard_screenshot.py [OUTPUT.png]

Fills a throwaway database (TEST_DATABASE_URL's server, else a private one)
with a small, plausible queue, serves the dashboard and photographs the
overview with headless Chromium (tests/screenshots/dashboard-overview.png by
default).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import psycopg
from dashboard_helpers import chromium, serve_app, wait_for
from pg_server import start_server

from worker_cli.dashboard import create_app
from worker_cli.schema.migrate import migrate

OUTPUT = Path(__file__).resolve().parent / "screenshots" / "dashboard-overview.png"

DEMO = """
select graphile_worker.add_jobs(array(
  select (task, json_build_object('user', n), queue, now() + delay * interval '1 minute',
          null, null, null, null)::graphile_worker.job_spec
  from (values
    ('send_email', null::text, 1400, -30), ('send_email', null, 260, 45),
    ('resize_image', null, 820, -5), ('resize_image', null, 90, 20),
    ('sync_crm', 'crm', 35, -2), ('billing/charge', 'billing', 12, -1),
    ('reports/nightly', null, 3, 600)
  ) as spec (task, queue, jobs, delay)
  cross join lateral generate_series(1, spec.jobs) as n
));
update graphile_worker._private_jobs set attempts = 25, max_attempts = 25,
  last_error = 'SMTPRecipientsRefused: {''bob@example.invalid'': (550, ''5.1.1 user unknown'')}',
  updated_at = now() - interval '4 minutes'
where id in (select id from graphile_worker._private_jobs where run_at < now() order by id limit 6);
update graphile_worker._private_jobs set attempts = 2, run_at = now() + interval '7 seconds',
  last_error = 'TimeoutError: image service did not answer in 30s',
  updated_at = now() - interval '40 seconds'
where id in (select id from graphile_worker._private_jobs where task_id = (select id
  from graphile_worker._private_tasks where identifier = 'resize_image') order by id limit 3);
update graphile_worker._private_jobs set attempts = 4, run_at = now() + interval '50 seconds',
  last_error = 'CardDeclined: insufficient funds (charge ch_3Pq)',
  updated_at = now() - interval '12 seconds'
where id = (select max(id) from graphile_worker._private_jobs where task_id = (select id
  from graphile_worker._private_tasks where identifier = 'billing/charge'));
update graphile_worker._private_jobs set locked_at = now() - interval '3 seconds',
  locked_by = 'pool-4f0c9d2e8a7b6c5d4e', attempts = attempts + 1
where id in (select id from graphile_worker._private_jobs where run_at <= now()
  and attempts = 0 and job_queue_id is null order by id desc limit 7)
  or id = (select min(id) from graphile_worker._private_jobs where job_queue_id = (
    select id from graphile_worker._private_job_queues where queue_name = 'crm'));
update graphile_worker._private_job_queues set locked_at = now() - interval '2 seconds',
  locked_by = 'pool-4f0c9d2e8a7b6c5d4e' where queue_name = 'crm';
insert into graphile_worker._private_py_heartbeats (pool_id, timeout, hostname, pid,
  concurrency, task_identifiers, version, jobs_done, jobs_done_before, beat_before)
values ('pool-4f0c9d2e8a7b6c5d4e', interval '5 minutes', 'worker-1', 4123, 8,
  '{billing/charge,reports/nightly,resize_image,send_email,sync_crm}', '0.1.0',
  48213, 47790, now() - interval '30 seconds');
"""


async def fill(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn, "graphile_worker")
        await conn.execute(DEMO)


def main() -> None:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    with start_server() as server, server.database() as url:
        asyncio.run(fill(url))
        with serve_app(create_app(url, refresh=0)) as base, chromium() as browser:
            browser.set_window_size(1280, 1480)
            browser.get(base + "/")
            wait_for(browser, "#failures-table")
            output.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(output))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
