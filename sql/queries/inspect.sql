-- Reads of the memory inspector (harbor-pg inspect, harbor_pg/inspect/). Every statement
-- but inspect_identities runs as the application role with the chosen identity set by
-- harbor.set_identity(), so row-level security decides what the page may show.

-- name: inspect_login
-- Whether the application login is bound to an identity (harbor.bind_role), and to which.
select harbor.caller_is_bound() as bound, harbor.caller_tenant() as tenant_id,
       harbor.caller_project() as project_id, harbor.caller_user() as user_id

-- name: inspect_identities
-- The identities a tenant's rows are keyed on (elevated role, its tenant set): each
-- project, user, session and run with how many turns, memories and working states it has.
-- Ids and counts only, never content.
with seen as (
    select m.project_id, m.user_id, m.session_id, '' as run_id,
           count(*) as turns, 0 as memories, 0 as states, max(m.created_at) as last_seen
      from harbor.messages m
     where m.tenant_id = %(tenant_id)s::text
     group by 1, 2, 3
    union all
    select m.project_id, m.user_id, m.session_id, m.run_id,
           0, count(*), 0, max(m.created_at)
      from harbor.memories m
     where m.tenant_id = %(tenant_id)s::text and m.user_id <> ''
     group by 1, 2, 3, 4
    union all
    select w.project_id, w.user_id, w.session_id, w.run_id,
           0, 0, count(*), max(w.updated_at)
      from harbor.working_state w
     where w.tenant_id = %(tenant_id)s::text
       and (w.expires_at is null or w.expires_at > pg_catalog.now())
     group by 1, 2, 3, 4
)
select s.project_id, s.user_id, s.session_id, s.run_id,
       sum(s.turns)::bigint as turns, sum(s.memories)::bigint as memories,
       sum(s.states)::bigint as states, max(s.last_seen) as last_seen
  from seen s
 group by 1, 2, 3, 4
 order by s.user_id, max(s.last_seen) desc nulls last, s.session_id, s.run_id, s.project_id
 limit %(limit)s::integer

-- name: inspect_memories
-- The memories the identity sees, filtered by scope, type, sensitivity, source and entity,
-- valid at as_of (default now) or every version (all_versions), matching a full-text search.
select m.id, m.scope::text as scope, m.memory_type::text as memory_type,
       m.sensitivity::text as sensitivity, m.source, m.content, m.context, m.importance,
       m.entity_ids, lower(m.valid) as valid_from, upper(m.valid) as invalid_at,
       m.superseded_by, m.source_session_id, m.created_at,
       (m.valid @> pg_catalog.now()
        and not coalesce(m.expires_at <= pg_catalog.now(), false)) as is_current,
       case when %(q)s::text is null then null
            else pg_catalog.ts_rank(m.fts, pg_catalog.websearch_to_tsquery('english', %(q)s::text))
       end as text_rank
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text])
   and (%(scope)s::text is null or m.scope::text = %(scope)s::text)
   and (%(memory_type)s::text is null or m.memory_type::text = %(memory_type)s::text)
   and (%(sensitivity)s::text is null or m.sensitivity::text = %(sensitivity)s::text)
   and (%(source)s::text is null or m.source = %(source)s::text)
   and (%(entity)s::text is null or m.entity_ids @> array[%(entity)s::text])
   and (%(all_versions)s::boolean
        or (m.valid @> coalesce(%(as_of)s::timestamptz, pg_catalog.now())
            and not coalesce(m.expires_at <= coalesce(%(as_of)s::timestamptz, pg_catalog.now()),
                             false)))
   and (%(q)s::text is null
        or m.fts @@ pg_catalog.websearch_to_tsquery('english', %(q)s::text))
 order by text_rank desc nulls last, lower(m.valid) desc, m.id
 limit %(limit)s::integer

-- name: inspect_memory_facets
-- What the filters can choose from: the scopes, types, sensitivities and sources of the
-- identity's visible memories, with counts (every version).
select f.facet, f.value, count(*) as n
  from harbor.memories m
 cross join lateral (values ('scope', m.scope::text), ('memory_type', m.memory_type::text),
                            ('sensitivity', m.sensitivity::text), ('source', m.source)) f(facet, value)
 where m.tenant_id = any (array['', %(tenant_id)s::text])
 group by f.facet, f.value
 order by f.facet, count(*) desc, f.value

-- name: inspect_memory
-- One memory the identity sees, every column (no text vector).
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at, m.source_user_id, (m.valid @> pg_catalog.now()
        and not coalesce(m.expires_at <= pg_catalog.now(), false)) as is_current
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text]) and m.id = %(id)s::text

-- name: inspect_entity_memories
-- Other currently valid memories the identity sees that name one of these entities.
select m.id, m.scope::text as scope, m.memory_type::text as memory_type, m.content,
       m.entity_ids
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text])
   and m.entity_ids && %(entity_ids)s::text[]
   and m.id <> %(id)s::text
   and m.valid @> pg_catalog.now()
   and not coalesce(m.expires_at <= pg_catalog.now(), false)
 order by lower(m.valid) desc, m.id
 limit %(limit)s::integer

-- name: inspect_turns
-- The turns of the identity's session, oldest first (at most limit, the newest ones).
select t.id, t.role, t.content, t.name, t.tool_call_id, t.token_estimate, t.created_at
  from (select m.id, m.role::text as role, m.content, m.name, m.tool_call_id,
               m.token_estimate, m.created_at
          from harbor.messages m
         where m.tenant_id = %(tenant_id)s::text and m.user_id = %(user_id)s::text
           and m.session_id = %(session_id)s::text
         order by m.id desc
         limit %(limit)s::integer) t
 order by t.id

-- name: inspect_source_turns
-- The turns a memory names as its provenance, as far as the identity's session shows them.
select m.id, m.role::text as role, m.content, m.created_at
  from harbor.messages m
 where m.tenant_id = %(tenant_id)s::text and m.session_id = %(session_id)s::text
   and m.id = any (%(ids)s::bigint[])
 order by m.id

-- name: inspect_working_state
-- The identity's run's working state, unexpired (the policy hides expired versions).
select w.run_id, w.project_id, w.state, w.expires_at, w.updated_at,
       w.expires_at - pg_catalog.now() as expires_in
  from harbor.working_state w
 where w.tenant_id = %(tenant_id)s::text and w.user_id = %(user_id)s::text
   and w.session_id = %(session_id)s::text and w.run_id = %(run_id)s::text
 order by w.id desc
 limit 1

-- name: inspect_read_only
-- The inspector only reads: its transactions are read only, whatever it sends.
set transaction read only

-- name: inspect_jobs
-- The session's jobs on the queue that are waiting, running or failed, newest first
-- (as the identity: sql/policies/jobs.sql shows it its session's jobs, ids and states
-- only; their errors are the queue role's to read, with harbor-pg jobs).
select j.id, j.task_name, j.status::text as status, j.attempts, j.scheduled_at
  from harbor_jobs.procrastinate_jobs j
 where j.args operator(pg_catalog.->>) 'tenant_id' = %(tenant_id)s::text
   and j.args operator(pg_catalog.->>) 'user_id' = %(user_id)s::text
   and j.args operator(pg_catalog.->>) 'session_id' = %(session_id)s::text
   and j.status in ('todo', 'doing', 'failed')
 order by j.id desc
 limit 50
