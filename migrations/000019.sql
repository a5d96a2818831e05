-- Revision 19 (breaking): marks the move from worker-held to pool-held locks
-- (locked_by names a worker pool). No structural change.
select 1;
