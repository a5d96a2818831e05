-- Limits that one job cannot break (issue 41). Changes the functions of
-- py/000015.sql:
--
-- * A partition key of any length and content: a value longer than 256
--   bytes (a payload field's, or helpers.limit's partition) is keyed by its
--   first 64 characters and the SHA-256 of the whole, so it always fits the
--   state's primary key (a btree entry holds about 2.7 kB: one longer value
--   failed every fetch of its limit, for ever); a payload PostgreSQL cannot
--   read as text (a \u0000 escape, a lone surrogate) counts under the empty
--   value, as a job without the field does. Shorter values stay as they are.
-- * An operation limit taken again by the job that holds it (a nested
--   block) is granted at once, without a second slot or start.
-- * A limit set or changed while jobs run counts them: py_set_limit puts
--   every job of the task (or queue) locked now, by any pool, Node's
--   included, in the running set of its partition value. It first waits for
--   the fetches in flight (an access exclusive lock on _private_py_limits,
--   which every fetch reads) and holds new ones until it commits, so a fetch
--   never takes jobs of the task without either seeing the limit or being
--   seen by it.

-- Partition keys stored before: longer ones take their new form. The
-- expression is py_limit_key's body (functions.sql), written out: the
-- functions are applied after the last pending revision, so on an upgrade
-- py_limit_key does not exist yet when this runs.
update {{schema}}._private_py_limit_state as st
set partition = case
    when octet_length(st.partition) <= 256 and strpos(st.partition, '...sha256:') = 0
      then st.partition
    else left(st.partition, 64) || '...sha256:'
      || encode(sha256(convert_to(st.partition, 'UTF8')), 'hex')
  end
where st.partition <> case
    when octet_length(st.partition) <= 256 and strpos(st.partition, '...sha256:') = 0
      then st.partition
    else left(st.partition, 64) || '...sha256:'
      || encode(sha256(convert_to(st.partition, 'UTF8')), 'hex')
  end;

-- Functions live in functions.sql (one definition each, applied after the
-- last pending revision): this revision added py_limit_key,
-- py_limit_partition and py_limit_use, and changed py_set_limit,
-- py_fetch_limited_jobs, py_limit_acquire and py_limit_release.
