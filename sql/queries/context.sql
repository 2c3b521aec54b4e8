-- Queries of the per-turn context: the rolling session summary and the
-- background-summary lease. Every statement runs under row-level security with
-- the caller's identity set, so each sees and writes only the caller's session.

-- name: context_load_summary
-- The newest currently valid SESSION/SUMMARY memory of the caller's session.
-- The memory column list of get_memory (long_term.sql), repeated on purpose.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.scope = 'session'
   and m.user_id = %(user_id)s::text and m.session_id = %(session_id)s::text
   and m.memory_type = 'summary' and upper_inf(m.valid)
 order by m.updated_at desc, m.id
 limit 1

-- name: context_insert_summary
-- Create the session summary (the database sets its id from the owner fields: harbor.summary_id
-- in guards.sql); nothing if this session's summary exists already, or if
-- a concurrent writer just created the same summary text (no conflict target, so the
-- unique index on owner + content hash of current rows is an arbiter too: two builders folding the
-- same turns at once produce the same text, and the loser must see a lost race, not an error).
insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                             principal_id, memory_type, importance, content, content_hash,
                             entity_ids, source, sensitivity, source_session_id,
                             source_message_ids, metadata)
values (%(tenant_id)s::text, %(id)s::text, 'session', '', %(user_id)s::text,
        %(session_id)s::text, '', %(principal_id)s::text, 'summary', %(importance)s::real,
        %(content)s::text, %(content_hash)s::text, '{}', 'summary', 'none',
        %(session_id)s::text, %(source_message_ids)s::text[], %(metadata)s::jsonb)
on conflict do nothing
returning id

-- name: context_refresh_summary
-- Refresh the summary in place, only if its frontier is still the one the caller read.
-- Ownership columns (principal_id, project_id, created_at, source_session_id) stay as saved.
update harbor.memories m
   set content = %(content)s::text,
       content_hash = %(content_hash)s::text,
       source_message_ids = %(source_message_ids)s::text[],
       metadata = %(metadata)s::jsonb,
       updated_at = pg_catalog.now()
 where m.tenant_id = %(tenant_id)s::text and m.id = %(id)s::text
   and m.scope = 'session' and m.memory_type = 'summary'
   and m.user_id = %(user_id)s::text and m.session_id = %(session_id)s::text
   and upper_inf(m.valid)
   and coalesce(m.metadata ->> 'last_covered_message_id', '')
       = %(expected_frontier)s::text
returning m.id

-- name: context_acquire_summary_lease
-- Take the session's background-summary lease in one atomic statement: only when no live
-- lease exists, the cooldown has passed and enough turns arrived since the last summary.
-- Concurrent callers serialise on the primary key; exactly one gets a row back.
-- The session's turns are counted as the due rule counts them (harbor._session_turns:
-- the session tested once against the caller's identity, not each turn).
with turns as (
    select harbor._session_turns(%(tenant_id)s::text, %(user_id)s::text,
                                 %(session_id)s::text, null) as n
)
insert into harbor.session_state as s (tenant_id, user_id, session_id, summary_lease_until,
                                       turns_at_summary)
select %(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text,
       pg_catalog.clock_timestamp()
           + make_interval(secs => %(lease_seconds)s::double precision),
       0
  from turns
 where turns.n >= %(min_turns)s::bigint
on conflict (tenant_id, user_id, session_id) do update
   set summary_lease_until = excluded.summary_lease_until
 where (s.summary_lease_until is null or s.summary_lease_until <= pg_catalog.clock_timestamp())
   and (s.summarised_at is null
        or s.summarised_at <= pg_catalog.clock_timestamp()
                              - make_interval(secs => %(cooldown_seconds)s::double precision))
   and (select t.n from turns t) >= %(min_turns)s::bigint
   and ((select t.n from turns t) < s.turns_at_summary
        or (select t.n from turns t) - s.turns_at_summary >= %(min_turns)s::bigint)
returning s.summary_lease_until, s.turns_at_summary, (select t.n from turns t) as turns

-- name: context_release_summary_lease
-- Drop the lease, if the caller still holds it, and record nothing: a queued fold that
-- failed, so that its retry finds the session still due and takes the lease again.
update harbor.session_state s
   set summary_lease_until = null
 where s.tenant_id = %(tenant_id)s::text and s.user_id = %(user_id)s::text
   and s.session_id = %(session_id)s::text
   and s.summary_lease_until = %(lease_until)s::timestamptz
returning s.session_id

-- name: context_finish_summary_lease
-- Record a finished summary and drop the lease, if the caller still holds it. With the count
-- goes the id of the last of that many turns, in id order (summarised_through): from then
-- on the summary rule counts only the turns after it (harbor.summary_due_rows). Null when
-- the session no longer holds that many turns (some were deleted since the count).
update harbor.session_state s
   set summarised_at = pg_catalog.clock_timestamp(),
       turns_at_summary = %(turns_at_summary)s::bigint,
       summary_lease_until = null,
       summarised_through = (
           select case when pg_catalog.count(*) = %(turns_at_summary)s::bigint
                       then coalesce(pg_catalog.max(t.id), 0) end
             from (select m.id from harbor.messages m
                    where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
                      and m.session_id = %(session_id)s::text
                    order by m.id
                    limit %(turns_at_summary)s::bigint) t)
 where s.tenant_id = %(tenant_id)s::text and s.user_id = %(user_id)s::text
   and s.session_id = %(session_id)s::text
   and s.summary_lease_until = %(lease_until)s::timestamptz
returning s.session_id
