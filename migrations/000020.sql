-- Revision 20: add_job/add_jobs create missing tasks and queues without
-- consuming identity values for the ones that exist (functions.sql).
select 1;
