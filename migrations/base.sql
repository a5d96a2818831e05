-- Revisions 1-16 in one step: the structure graphile-worker (Node) has at
-- revision 16, built on an empty schema. Constraint, index and sequence names
-- (and, for PostgreSQL 18+, the NOT NULL constraint names) are the ones Node's
-- own history leaves behind, so later Node revisions that refer to them by
-- name keep working.

create table {{schema}}._private_tasks (
  id int
    constraint tasks_id_not_null not null
    generated always as identity
    constraint tasks_pkey primary key,
  identifier text
    constraint tasks_identifier_not_null not null
    constraint tasks_identifier_key unique
    constraint tasks_identifier_check check (length(identifier) <= 128)
);
alter sequence {{schema}}._private_tasks_id_seq rename to tasks_id_seq;

create table {{schema}}._private_job_queues (
  id int
    constraint job_queues_id_not_null not null
    generated always as identity
    constraint job_queues_pkey1 primary key,
  queue_name text
    constraint job_queues_queue_name_not_null1 not null
    constraint job_queues_queue_name_key unique
    constraint job_queues_queue_name_check check (length(queue_name) <= 128),
  locked_at timestamptz,
  locked_by text,
  is_available boolean
    constraint job_queues_is_available_not_null not null
    generated always as (locked_at is null) stored
);
alter sequence {{schema}}._private_job_queues_id_seq rename to job_queues_id_seq;

create table {{schema}}._private_jobs (
  id bigint
    constraint jobs_id_not_null1 not null
    generated always as identity
    constraint jobs_pkey1 primary key,
  job_queue_id int,
  task_id int constraint jobs_task_id_not_null not null,
  payload json constraint jobs_payload_not_null1 not null default '{}'::json,
  priority smallint constraint jobs_priority_not_null1 not null default 0,
  run_at timestamptz constraint jobs_run_at_not_null1 not null default now(),
  attempts smallint constraint jobs_attempts_not_null1 not null default 0,
  max_attempts smallint
    constraint jobs_max_attempts_not_null1 not null
    default 25
    constraint jobs_max_attempts_check check (max_attempts >= 1),
  last_error text,
  created_at timestamptz constraint jobs_created_at_not_null1 not null default now(),
  updated_at timestamptz constraint jobs_updated_at_not_null1 not null default now(),
  key text
    constraint jobs_key_key1 unique
    constraint jobs_key_check check (length(key) > 0 and length(key) <= 512),
  locked_at timestamptz,
  locked_by text,
  revision int constraint jobs_revision_not_null1 not null default 0,
  flags jsonb,
  is_available boolean
    constraint jobs_is_available_not_null not null
    generated always as (locked_at is null and attempts < max_attempts) stored
);
alter sequence {{schema}}._private_jobs_id_seq rename to jobs_id_seq1;

-- The fetch query walks these: every available job, and the queue-less ones.
create index jobs_main_index on {{schema}}._private_jobs
  using btree (priority, run_at) include (id, task_id, job_queue_id)
  where is_available = true;
create index jobs_no_queue_index on {{schema}}._private_jobs
  using btree (priority, run_at) include (id, task_id)
  where is_available = true and job_queue_id is null;

create table {{schema}}._private_known_crontabs (
  identifier text
    constraint known_crontabs_identifier_not_null not null
    constraint known_crontabs_pkey primary key,
  known_since timestamptz constraint known_crontabs_known_since_not_null not null,
  last_execution timestamptz
);

-- Private tables: no policies, so roles without bypass see nothing directly.
alter table {{schema}}._private_tasks enable row level security;
alter table {{schema}}._private_job_queues enable row level security;
alter table {{schema}}._private_jobs enable row level security;
alter table {{schema}}._private_known_crontabs enable row level security;

create type {{schema}}.job_spec as (
  identifier text,
  payload json,
  queue_name text,
  run_at timestamptz,
  max_attempts smallint,
  job_key text,
  priority smallint,
  flags text[]
);
