-- The record of Python-only migrations (migrations/py/NNNNNN.sql). Node never
-- reads it; rows in "migrations" stay exactly Node's 1..20.
create table if not exists {{schema}}._private_py_migrations (
  id int primary key,
  ts timestamptz not null default now()
);
