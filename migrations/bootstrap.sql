-- Before any revision: the schema and the table that records revisions, as
-- graphile-worker (Node) creates them (safe to run when they exist).
create schema if not exists {{schema}};
create table if not exists {{schema}}.migrations (
  id int primary key,
  ts timestamptz not null default now()
);
alter table {{schema}}.migrations add column if not exists breaking boolean not null default false;
