-- Revision 18: "jobs:insert" is sent by add_job/add_jobs/remove_job themselves
-- (functions.sql) with a job count, instead of by a statement trigger. Only a
-- database Node installed at revision 16-17 has that trigger.
drop trigger if exists _900_after_insert on {{schema}}._private_jobs;
drop function if exists {{schema}}.tg_jobs__after_insert();
