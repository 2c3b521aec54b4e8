-- name: append_message
-- Append one turn to the caller's session; returns its id and timestamp. The session's
-- lock (held to commit) is taken before the id is drawn, so within a session ids are in
-- commit order: a reader following id > cursor never skips a turn committed later with a
-- smaller id (the rolling summary's frontier is such a cursor).
-- First the user's row of harbor.owner_locks (scope 'user', migration 0027), taken as the
-- session's is (below): an erasure of the user locks it first, so it waits for the
-- appends in flight, whatever their session, and later ones wait for it (harbor.erase).
-- A user's appends in two sessions wait for each other on it, for one statement.
-- Then the session's: the statement reads the user lock's CTE first (on Citus, CTEs run
-- in the order they are written), so it is taken after.
-- The session's lock is its row of harbor.owner_locks: the first append inserts it
-- (a concurrent first append waits on that insert, then locks the row), each later one
-- locks it (ON CONFLICT DO UPDATE locks the row even though WHERE false updates
-- nothing). Its policy admits only the caller's own session, so no one else can hold it.
-- The aggregate reads both CTEs whole, the user's first, so both rows are locked before the
-- id is drawn. Its count is tested (always true) so that the planner keeps it: a count
-- nothing reads was dropped with its reads of the CTEs, and a writing CTE that nothing
-- reads runs after the statement, after the id (ids then left commit order: a reader
-- following id > cursor skipped turns, tests/integration/test_turn_order.py).
-- append_message_check_summary below repeats this statement inside its own (on purpose).
with user_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, '', 'user')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
), session_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, 'session')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
)
insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id, role,
                             content, name, tool_calls, tool_call_id, metadata, token_estimate)
select %(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, %(project_id)s::text,
       %(principal_id)s::text, %(role)s::harbor.message_role, %(content)s::text, %(name)s::text,
       %(tool_calls)s::jsonb, %(tool_call_id)s::text, %(metadata)s::jsonb,
       %(token_estimate)s::integer
  from (select count(*) as n from (select 1 from user_lock union all select 1 from session_lock) l) locked
 where locked.n >= 0
returning id, created_at

-- name: append_message_check_summary
-- append_message, and in the same statement whether the session is now due a background
-- summary (harbor.summary_due_rows, the new turn counted). A read: nothing is
-- written for the summary here, and the lease statement stays the one that decides.
-- The session's lock comes before the id, as in append_message.
-- Its session_lock CTE repeats append_message's on purpose: each named query is one
-- statement, sent whole in one round trip.
with user_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, '', 'user')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
), session_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, 'session')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
), appended as (
    insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id,
                                 role, content, name, tool_calls, tool_call_id, metadata,
                                 token_estimate)
    select %(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text,
           %(project_id)s::text, %(principal_id)s::text, %(role)s::harbor.message_role,
           %(content)s::text, %(name)s::text, %(tool_calls)s::jsonb, %(tool_call_id)s::text,
           %(metadata)s::jsonb, %(token_estimate)s::integer
      from (select count(*) as n from (select 1 from user_lock union all select 1 from session_lock) l) locked
 where locked.n >= 0
    returning id, created_at
)
-- the statement's snapshot does not include the row it inserts: one unseen turn.
-- harbor.summary_due_rows() is inlined here (called from FROM), not called per row.
select a.id, a.created_at, d.due as summary_due
  from appended a
 cross join harbor.summary_due_rows(%(tenant_id)s::text, %(user_id)s::text,
                                    %(session_id)s::text, %(min_turns)s::bigint,
                                    %(cooldown_seconds)s::double precision, 1) d

-- name: append_message_with_jobs
-- append_message_check_summary, and in the same statement the turn's jobs on the queue
-- (harbor_jobs.queue_session_jobs, sql/functions/jobs.sql): its session's fact extraction
-- when %(extract)s, and the session's summary fold when %(fold)s and the session is now
-- due one. The jobs commit with the turn or not at all. A session has at most one
-- extraction waiting, from its first turn on: the append that locks the session's row of
-- harbor.owner_locks sets that row's extraction_queued there when it was not set (the
-- ON CONFLICT's WHERE and SET read the row as locked, not as the statement's snapshot
-- saw it), and only that append queues the job; a turn appended while it waits is read
-- by it, as the job clears the flag under the same lock when it starts (migration 0029).
-- So a turn costs a job row only when its session has none waiting. The jobs' arguments
-- are ids only: the caller's identity, which that function reads itself, and, for
-- extraction, the turn's id. Their lock is the session's, so one session's jobs run one
-- at a time, in the order they were queued; with %(slots)s > 0 it is one of that many
-- slots instead (the session's always the same one), so at most that many run at once,
-- on every worker together: what keeps a rate-limited model from being flooded. The
-- extraction starts %(delay_seconds)s after the turn that queued it (when above 0), so
-- that a conversation's turns of that while share it. A fold queued while an earlier one
-- waits finds nothing due when it runs (the summary lease decides) and writes nothing.
-- The user and session locks and the due check repeat append_message_check_summary's on
-- purpose.
with user_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, '', 'user')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
), session_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope,
                                         extraction_queued)
    values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, 'session',
            %(extract)s::boolean)
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set extraction_queued = true
     where %(extract)s::boolean and not l.extraction_queued
    returning l.extraction_queued as queue_extraction
), appended as (
    insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id,
                                 role, content, name, tool_calls, tool_call_id, metadata,
                                 token_estimate)
    select %(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text,
           %(project_id)s::text, %(principal_id)s::text, %(role)s::harbor.message_role,
           %(content)s::text, %(name)s::text, %(tool_calls)s::jsonb, %(tool_call_id)s::text,
           %(metadata)s::jsonb, %(token_estimate)s::integer
      from (select count(*) as n from (select 1 from user_lock union all select 1 from session_lock) l) locked
 where locked.n >= 0
    returning id, created_at
), extraction as (
    select coalesce(pg_catalog.bool_or(s.queue_extraction), false) as due from session_lock s
)
select a.id, a.created_at, d.due as summary_due,
       case when e.due or (%(fold)s::boolean and d.due)
            then harbor_jobs.queue_session_jobs(a.id, e.due, %(fold)s::boolean and d.due,
                                                %(slots)s::integer,
                                                %(delay_seconds)s::double precision)
       end as job_ids
  from appended a
 cross join extraction e
 cross join harbor.summary_due_rows(%(tenant_id)s::text, %(user_id)s::text,
                                    %(session_id)s::text, %(min_turns)s::bigint,
                                    %(cooldown_seconds)s::double precision, 1) d

-- name: recent_turns
-- The newest turns of a session in one statement that also sets the identity.
select * from harbor.recent_turns(%(tenant_id)s::text, %(project_id)s::text,
    %(principal_id)s::text, %(user_id)s::text, %(session_id)s::text, %(run_id)s::text,
    %(limit)s::integer)

-- name: messages_after
-- A page of the session's turns after a cursor id, oldest first (summary catch-up).
select id, role::text as role, content, name, tool_calls, tool_call_id, metadata, created_at
  from harbor.messages m
 where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text and m.id > %(after_id)s::bigint
   and (%(before_id)s::bigint is null or m.id < %(before_id)s::bigint)
 order by m.id
 limit %(limit)s::integer

-- name: turns_through
-- The newest turns of the caller's session up to and including one turn, oldest first:
-- what a queued extraction reads, however many turns came after its own.
select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id, t.metadata, t.created_at
  from (select m.id, m.role::text as role, m.content, m.name, m.tool_calls, m.tool_call_id,
               m.metadata, m.created_at
          from harbor.messages m
         where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
           and m.session_id = %(session_id)s::text and m.id <= %(message_id)s::bigint
         order by m.id desc
         limit %(limit)s::integer) t
 order by t.id

-- name: extraction_claim
-- A queued session extraction starting: its session's extraction_queued flag cleared,
-- under the session row's lock, so that this waits for the appends in flight, each of
-- which either saw the flag set (its turn is this job's) or set it and queued the next
-- job (migration 0029). Run in the transaction of extraction_turns, ahead of it.
update harbor.owner_locks l set extraction_queued = false
 where l.tenant_id = %(tenant_id)s::text and l.user_id = %(user_id)s::text
   and l.session_id = %(session_id)s::text and l.scope = 'session'
   and l.project_id = '' and l.run_id = ''

-- name: extraction_turns
-- The turns a queued session extraction reads, oldest first: from its first turn on,
-- and the %(context)s turns before that one (what a first window shows the model of the
-- conversation so far), at most %(limit)s of the newer ones (the job reads on in pages).
select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id, t.metadata,
       t.created_at
  from (select m.id, m.role::text as role, m.content, m.name, m.tool_calls,
               m.tool_call_id, m.metadata, m.created_at
          from harbor.messages m
         where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
           and m.session_id = %(session_id)s::text and m.id < %(from_id)s::bigint
         order by m.id desc
         limit %(context)s::integer) t
union all
select t.id, t.role, t.content, t.name, t.tool_calls, t.tool_call_id, t.metadata,
       t.created_at
  from (select m.id, m.role::text as role, m.content, m.name, m.tool_calls,
               m.tool_call_id, m.metadata, m.created_at
          from harbor.messages m
         where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
           and m.session_id = %(session_id)s::text and m.id >= %(from_id)s::bigint
         order by m.id
         limit %(limit)s::integer) t
 order by id

-- name: count_messages
-- How many turns the caller's session holds.
select count(*) as n from harbor.messages m
 where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text

-- name: clear_messages
-- Delete every turn of the caller's session.
delete from harbor.messages m
 where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text

-- name: summary_due
-- Read-only: whether the caller's session is due a background summary
-- (harbor.summary_due_rows, inlined here as in the append statement).
select d.due
  from harbor.summary_due_rows(%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text,
                               %(min_turns)s::bigint,
                               %(cooldown_seconds)s::double precision) d

-- name: recent_live_turns
-- recent_turns seen through a session TTL of inactivity (seconds; null: never):
-- the newest turns up to the first gap longer than the TTL, counting the gap
-- from the newest turn to now, so an expired session's turns are invisible at
-- once and a turn after the expiry starts afresh. harbor.recent_turns sets the
-- identity; the predicate reads only the rows it returns.
select l.id, l.role, l.content, l.name, l.tool_calls, l.tool_call_id, l.metadata, l.created_at
  from (select g.*,
               bool_or(g.gap_after) over (order by g.id desc
                                          rows between unbounded preceding and current row)
                   as expired
          from (select r.*,
                       coalesce(lag(r.created_at) over (order by r.id desc), pg_catalog.now())
                           - r.created_at
                           > make_interval(secs => %(ttl_seconds)s::double precision)
                           as gap_after
                  from harbor.recent_turns(%(tenant_id)s::text, %(project_id)s::text,
                       %(principal_id)s::text, %(user_id)s::text, %(session_id)s::text,
                       %(run_id)s::text, %(limit)s::integer) r) g) l
 where %(ttl_seconds)s::double precision is null or not l.expired
 order by l.id
