"""Make the README's screenshot of the dashboard's overview.

    python bench/dashboard_screenshot.py [OUTPUT.png]
    python bench/dashboard_screenshot.py --page finished [OUTPUT.png]
    python bench/dashboard_screenshot.py --page finished-job [OUTPUT.png]
    python bench/dashboard_screenshot.py --page crontab [OUTPUT.png]
    python bench/dashboard_screenshot.py --page bulk [OUTPUT.png]
    python bench/dashboard_screenshot.py --page job-errors [OUTPUT.png]
    python bench/dashboard_screenshot.py --width 420 --page jobs OUTPUT.png

Fills a throwaway database (TEST_DATABASE_URL's server, else a private one)
with a small, plausible queue and history, serves the dashboard and
photographs a page with headless Chromium: the overview
(docs/images/dashboard-overview.png by default), the Finished view, or
the page of a finished job with a result (dashboard-finished.png,
dashboard-finished-job.png), the Jobs list, the confirmation of a bulk
retry (dashboard-bulk.png), a job's page with every attempt's error
(dashboard-job-errors.png); ``--width`` sets the window's
width (1280; 420 for a phone's).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from dashboard_helpers import chromium, serve_app, wait_for
from pg_server import start_server

from worker_cli.dashboard import create_app
from worker_cli.schema.migrate import migrate

OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "images" / "dashboard-overview.png"

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


# The history: a job id each, finished over the last half hour (some in one
# batch, one now()); succeeded with results, failed, and cancelled.
HISTORY = """
insert into graphile_worker._private_py_job_history (
  job_id, state, task_identifier, queue_name, priority, attempts, max_attempts, revision,
  result, result_error, last_error, created_at, run_at, started_at, finished_at, pool_id,
  cancel_requested_at, cancel_reason, expires_at)
select 100000 + n, spec.state, spec.task, spec.queue, 0, spec.attempts, 25, 0,
  case when spec.state = 'succeeded' then spec.result::json end, spec.result_error,
  spec.error, finished - interval '1 minute', finished - interval '1 minute',
  case when spec.started then finished - spec.took * interval '1 millisecond' end,
  finished, case when spec.started then 'pool-4f0c9d2e8a7b6c5d4e' end,
  case when spec.state = 'cancelled' then finished end, spec.reason,
  finished + interval '1 day'
from generate_series(1, 60) as n
cross join lateral (
  select now() - (60 - n) * interval '29 seconds' - (n % 7) * interval '1 second' as finished
) as f
cross join lateral (values (n % 12)) as k (kind)
cross join lateral (
  select * from (values
    (0, 'resize_image', null::text, 'succeeded', 1,
     '{"width": 640, "height": 427, "format": "webp", "bytes": 48213}', null::text,
     null::text, null::text, true, 840 + n * 7),
    (1, 'send_email', null, 'succeeded', 1, '{"message_id": "<20261121.' || n
     || '@mail.example.com>"}', null, null, null, true, 120 + n),
    (2, 'billing/charge', 'billing', 'succeeded', 2,
     '{"charge": "ch_3Pq' || n || '", "amount": 1999, "currency": "eur"}', null,
     null, null, true, 310),
    (3, 'send_email', null, 'failed', 25, null, null,
     'SMTPRecipientsRefused: {''bob@example.invalid'': (550, ''5.1.1 user unknown'')}',
     null, false, 0),
    (4, 'reports/nightly', null, 'succeeded', 1, null,
     'too large: 2400000 bytes, more than the limit of 1048576', null, null, true, 52000),
    (5, 'resize_image', null, 'cancelled', 1, null, null,
     'CancelledError: cancelled from the dashboard', 'the upload was deleted', true, 2300),
    (6, 'sync_crm', 'crm', 'succeeded', 1, '{"synced": 12, "skipped": 0}', null, null,
     null, true, 1450),
    (7, 'send_email', null, 'cancelled', 0, null, null, null, 'the order was refunded',
     false, 0),
    (8, 'send_email', null, 'succeeded', 3, '{"message_id": "<20261121.' || n
     || '@mail.example.com>"}', null, null, null, true, 95),
    (9, 'resize_image', null, 'succeeded', 1,
     '{"width": 1280, "height": 853, "format": "webp", "bytes": 130442}', null, null,
     null, true, 1210),
    (10, 'billing/charge', 'billing', 'succeeded', 1,
     '{"charge": "ch_3Pr' || n || '", "amount": 4900, "currency": "eur"}', null, null,
     null, true, 280),
    (11, 'sync_crm', 'crm', 'succeeded', 1, '{"synced": 3, "skipped": 1}', null, null,
     null, true, 990)
  ) as v (kind, task, queue, state, attempts, result, result_error, error, reason, started,
          took)
  where v.kind = k.kind
) as spec;
"""

# Six hours of throughput for the chart: jobs finished at a rate that rises
# and falls (a few failed for good, a few cancelled), waits growing with it.
CHART_HISTORY = """
insert into graphile_worker._private_py_job_history (
  job_id, state, task_identifier, priority, attempts, max_attempts, revision,
  created_at, run_at, started_at, finished_at, expires_at)
select 200000 + n, case when n % 41 = 0 then 'failed' when n % 97 = 0 then 'cancelled'
    else 'succeeded' end,
  (array['send_email', 'resize_image', 'billing/charge', 'sync_crm'])[1 + n % 4], 0, 1, 25, 0,
  f.at - w.wait, f.at - w.wait, f.at - interval '1 second', f.at, f.at + interval '1 day'
from generate_series(1, 4000) as n
cross join lateral (
  select now() - interval '6 hours' + (n / 4000.0) * interval '6 hours'
    + (sin(n / 170.0) * interval '9 minutes') as at
) as f
cross join lateral (
  select (1 + 20 * greatest(sin(n / 600.0), 0) + (n % 13)) * interval '1 second' as wait
) as w
where f.at < now();
update graphile_worker._private_jobs
  set created_at = now() - ((id * 37) % 350) * interval '1 minute' - interval '5 minutes';
"""

# Each failed attempt's error (migrations/py/000018.sql): the retried
# attempts of six hours for the chart (a burst of card declines two hours
# ago), and the four attempts of the billing/charge job now retrying (the
# newest of that task: its page is JOB_WITH_ERRORS).
ATTEMPT_ERRORS = """
insert into graphile_worker._private_py_job_errors (
  job_id, task_identifier, attempt, failed_at, error, retried, pool_id)
select 300000 + n, (array['resize_image', 'billing/charge', 'send_email'])[1 + n % 3], 1,
  now() - interval '6 hours' + (n / 3000.0) * interval '6 hours',
  'TimeoutError: image service did not answer in 30s', true, 'pool-4f0c9d2e8a7b6c5d4e'
from generate_series(1, 3000) as n
where n % 3 = 0 or n between 1700 and 1900;
insert into graphile_worker._private_py_job_errors (
  job_id, task_identifier, attempt, failed_at, error, retried, pool_id)
select j.id, 'billing/charge', a.attempt, now() - a.ago * interval '1 second', a.error, true,
  'pool-4f0c9d2e8a7b6c5d4e'
from (select max(id) as id from graphile_worker._private_jobs where task_id = (select id
  from graphile_worker._private_tasks where identifier = 'billing/charge')) as j
cross join (values
  (1, 400, 'ConnectionError: api.payments.example: [Errno 111] Connection refused'),
  (2, 390, 'RateLimited: 429 Too Many Requests (retry after 5s)'),
  (3, 370, 'CardDeclined: insufficient funds (charge ch_3Pp)' || chr(10)
    || '  File "tasks/billing/charge.py", line 31, in charge' || chr(10)
    || '    raise CardDeclined(reply.message)'),
  (4, 12, 'CardDeclined: insufficient funds (charge ch_3Pq)')
) as a (attempt, ago, error);
"""
#: The billing/charge job with four failed attempts (ids follow DEMO's order).
JOB_WITH_ERRORS = 2617

# The crontab the dashboard is given, and what the workers know of it.
DEMO_CRONTAB = """
# m h dom mon dow  task  ?options  {payload}
30 4 * * 1     send_weekly_email ?fill=2d&max=10 {onboarding: false}
0 */4 * * *    reports/rollup
30 2 * * *     reports/nightly ?id=nightly_paris&tz=Europe/Paris&queue=reports
0 9 * * 1-5    billing/charge ?id=invoices_ny&tz=America/New_York {batch: 'daily'}
*/15 * * * *   sync_crm ?queue=crm&jobKey=crm-sync
"""
KNOWN_CRONTABS = """
insert into graphile_worker._private_known_crontabs values
  ('send_weekly_email', now() - interval '60 days', now() - interval '3 days 2 hours'),
  ('reports/rollup', now() - interval '60 days', date_trunc('hour', now()) - interval '2 hours'),
  ('nightly_paris', now() - interval '20 days', now() - interval '16 hours'),
  ('sync_crm', now() - interval '60 days', date_trunc('minute', now()) - interval '4 minutes'),
  ('legacy_cleanup', now() - interval '200 days', now() - interval '45 days');
"""

#: The pages the script can photograph: path, the element to wait for, height.
PAGES = {
    "crontab": ("/crontab", "#cron-items", 1000),
    "overview": ("/", "#failures-table", 1900),
    "bulk": ("/bulk/retry?task=send_email&state=permanently_failed", "#bulk-confirm", 640),
    "finished": ("/finished", "#finished-table", 1200),
    "finished-job": ("/jobs/100048", "#job-result", 1000),
    "jobs": ("/jobs", "#jobs-table", 1200),
    "job-errors": (f"/jobs/{JOB_WITH_ERRORS}", "#job-attempt-errors", 1250),
}


async def fill(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn, "graphile_worker")
        await conn.execute(DEMO)
        await conn.execute(HISTORY)
        await conn.execute(KNOWN_CRONTABS)
        await conn.execute(CHART_HISTORY)
        await conn.execute(ATTEMPT_ERRORS)


def main() -> None:
    args = sys.argv[1:]
    page, width = "overview", 1280
    while args[:1] in (["--page"], ["--width"]):
        if args[0] == "--page":
            page = args[1]
        else:
            width = int(args[1])
        args = args[2:]
    path, element, height = PAGES[page]
    default = OUTPUT if page == "overview" else OUTPUT.with_name(f"dashboard-{page}.png")
    output = Path(args[0]) if args else default
    with start_server() as server, server.database() as url:
        asyncio.run(fill(url))
        with (
            serve_app(create_app(url, refresh=0, crontab=DEMO_CRONTAB)) as base,
            chromium() as browser,
        ):
            browser.set_window_size(width, height)
            browser.get(base + path)
            wait_for(browser, element)
            output.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(output))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
