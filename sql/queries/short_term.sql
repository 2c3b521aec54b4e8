-- name: append_message
-- Append one turn to the caller's session; returns its id and timestamp.
insert into harbor.messages (tenant_id, user_id, session_id, project_id, principal_id, role,
                             content, name, tool_calls, tool_call_id, metadata, token_estimate)
values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, %(project_id)s::text,
        %(principal_id)s::text, %(role)s::harbor.message_role, %(content)s::text, %(name)s::text,
        %(tool_calls)s::jsonb, %(tool_call_id)s::text, %(metadata)s::jsonb,
        %(token_estimate)s::integer)
returning id, created_at

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
-- turns since the last summary). Checked after each append, so an append that finds
-- nothing due writes nothing; the lease statement stays the one that decides.
with turns as (
    select count(*) as n from harbor.messages m
     where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
       and m.session_id = %(session_id)s::text
)
select t.n >= %(min_turns)s::bigint
       and (s.session_id is null
            or ((s.summary_lease_until is null
                 or s.summary_lease_until <= pg_catalog.clock_timestamp())
                and (s.summarised_at is null
                     or s.summarised_at <= pg_catalog.clock_timestamp()
                            - make_interval(secs => %(cooldown_seconds)s::double precision))
                and (t.n < s.turns_at_summary
                     or t.n - s.turns_at_summary >= %(min_turns)s::bigint))) as due
  from turns t
  left join harbor.session_state s
    on s.tenant_id = %(tenant_id)s::text and s.user_id = %(user_id)s::text
   and s.session_id = %(session_id)s::text
