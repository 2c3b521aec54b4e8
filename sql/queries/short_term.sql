-- name: append_message
-- Append one turn to the caller's session; returns its id and timestamp.
insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id, role,
                             content, name, tool_calls, tool_call_id, metadata, token_estimate)
values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, %(project_id)s::text,
        %(principal_id)s::text, %(role)s::harbor.message_role, %(content)s::text, %(name)s::text,
        %(tool_calls)s::jsonb, %(tool_call_id)s::text, %(metadata)s::jsonb,
        %(token_estimate)s::integer)
returning id, created_at

-- name: append_message_check_summary
-- append_message, and in the same statement whether the session is now due a background
-- summary (the rules of summary_due below, the new turn counted). A read: nothing is
-- written for the summary here, and the lease statement stays the one that decides.
with appended as (
    insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id,
                                 role, content, name, tool_calls, tool_call_id, metadata,
                                 token_estimate)
    values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text,
            %(project_id)s::text, %(principal_id)s::text, %(role)s::harbor.message_role,
            %(content)s::text, %(name)s::text, %(tool_calls)s::jsonb, %(tool_call_id)s::text,
            %(metadata)s::jsonb, %(token_estimate)s::integer)
    returning id, created_at
)
-- the statement's snapshot does not include the row it inserts: the counts add 1
select a.id, a.created_at,
       case
         -- never summarised: enough turns? (counts at most min_turns rows)
         when s.session_id is null then
           (select count(*) + 1 from (select 1 from harbor.messages m
                                       where m.tenant_id = %(tenant_id)s::text
                                         and m.user_id = %(user_id)s::text
                                         and m.session_id = %(session_id)s::text
                                       limit %(min_turns)s::bigint) first_turns)
             >= %(min_turns)s::bigint
         -- leased or cooling down: not due, and the session's turns are not counted
         when s.summary_lease_until > pg_catalog.clock_timestamp()
              or s.summarised_at > pg_catalog.clock_timestamp()
                     - make_interval(secs => %(cooldown_seconds)s::double precision) then false
         else
           (select c.n >= %(min_turns)s::bigint
                   and (c.n < s.turns_at_summary
                        or c.n - s.turns_at_summary >= %(min_turns)s::bigint)
              from (select count(*) + 1 as n from harbor.messages m
                     where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
                       and m.session_id = %(session_id)s::text) c)
       end as summary_due
  from appended a
  left join harbor.session_state s
    on s.tenant_id = %(tenant_id)s::text and s.user_id = %(user_id)s::text
   and s.session_id = %(session_id)s::text

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
-- Read-only: whether the session is due a background summary, by the same rules as
-- context_acquire_summary_lease (enough turns, no live lease, cooldown passed, enough new
-- turns since the last summary), so finding nothing due writes nothing; the lease
-- statement stays the one that decides. The session's turns are counted only when the
-- lease and the cooldown allow a summary (and at most min_turns of them before the first).
select case
         when s.session_id is null then
           (select count(*) from (select 1 from harbor.messages m
                                   where m.tenant_id = %(tenant_id)s::text
                                     and m.user_id = %(user_id)s::text
                                     and m.session_id = %(session_id)s::text
                                   limit %(min_turns)s::bigint) first_turns)
             >= %(min_turns)s::bigint
         when s.summary_lease_until > pg_catalog.clock_timestamp()
              or s.summarised_at > pg_catalog.clock_timestamp()
                     - make_interval(secs => %(cooldown_seconds)s::double precision) then false
         else
           (select c.n >= %(min_turns)s::bigint
                   and (c.n < s.turns_at_summary
                        or c.n - s.turns_at_summary >= %(min_turns)s::bigint)
              from (select count(*) as n from harbor.messages m
                     where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
                       and m.session_id = %(session_id)s::text) c)
       end as due
  from (select) one
  left join harbor.session_state s
    on s.tenant_id = %(tenant_id)s::text and s.user_id = %(user_id)s::text
   and s.session_id = %(session_id)s::text
