-- Revision 17: the public, read-only view of jobs (no payload).
create view {{schema}}.jobs as
select
  jobs.id,
  job_queues.queue_name,
  tasks.identifier as task_identifier,
  jobs.priority,
  jobs.run_at,
  jobs.attempts,
  jobs.max_attempts,
  jobs.last_error,
  jobs.created_at,
  jobs.updated_at,
  jobs.key,
  jobs.locked_at,
  jobs.locked_by,
  jobs.revision,
  jobs.flags
from {{schema}}._private_jobs as jobs
join {{schema}}._private_tasks as tasks on tasks.id = jobs.task_id
left join {{schema}}._private_job_queues as job_queues on job_queues.id = jobs.job_queue_id;
