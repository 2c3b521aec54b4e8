-- Queries of fact extraction (harbor_pg/extraction/extractor.py through the long-term stores).
-- All run as the invoker under row-level security; the explicit owner-key filters mirror what
-- the policies allow and let the planner use the owner indexes.

-- name: extraction_current_memories
-- The owner's currently valid memories in the scopes chat extraction writes, newest first.
-- One branch per scope, each an equality on the full owner key (an OR of the three, with
-- NULL switches, made the cached generic plan scan the tenant); a NULL key parameter
-- switches its scope off (the owner cannot address it, or it was not asked for).
-- The memory column list of get_memory (long_term.sql), repeated on purpose.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from (select * from harbor.memories u
         where u.tenant_id = %(tenant_id)s::text and u.scope = 'user'
           and u.user_id = %(user_user_id)s::text and u.project_id = ''
           and u.session_id = '' and u.run_id = ''
        union all
        select * from harbor.memories s
         where s.tenant_id = %(tenant_id)s::text and s.scope = 'session'
           and s.user_id = %(session_user_id)s::text and s.project_id = ''
           and s.session_id = %(session_session_id)s::text and s.run_id = ''
        union all
        select * from harbor.memories p
         where p.tenant_id = %(tenant_id)s::text and p.scope = 'project'
           and p.project_id = %(project_project_id)s::text and p.user_id = ''
           and p.session_id = '' and p.run_id = '') m
 where m.memory_type <> 'summary'
   and upper_inf(m.valid) and lower(m.valid) <= pg_catalog.now()
   and not coalesce(m.expires_at <= pg_catalog.now(), false)
 order by lower(m.valid) desc, m.id
 limit %(limit)s::integer

-- name: extraction_nearest_memory
-- The owner's most similar currently valid memory in one scope (harbor.nearest_current_memory).
select n.memory_id, n.similarity
  from harbor.nearest_current_memory(%(tenant_id)s::text, %(scope)s::harbor.memory_scope,
                                     %(project_id)s::text, %(user_id)s::text,
                                     %(session_id)s::text, %(run_id)s::text,
                                     %(model_id)s::text, %(dims)s::integer,
                                     %(embedding)s::public.vector,
                                     %(exclude_ids)s::text[]) n
 where not exists (select 1 from harbor.memories x
                    where x.tenant_id = %(tenant_id)s::text and x.id = n.memory_id
                      and x.expires_at <= pg_catalog.now())

-- name: extraction_insert_memory
-- Insert a memory valid from now() (or valid_from) and, when an embedding is given, its
-- vector, behind the similarity gate, in one statement (one round trip for a fact): when
-- the owner already has a currently valid memory at least dedup_threshold similar (a NULL
-- threshold: no gate), nothing is written and that memory comes back as restatement_of;
-- otherwise the row is inserted unless a currently valid duplicate exists (the unique
-- index memories_no_duplicate_current, the content-hash gate, also under concurrent
-- writers: then no id comes back). Always one row.
-- A duplicate past its expiry is closed first, as in save_memories (long_term.sql).
-- extraction_supersede_memory repeats this gate and insert on purpose (see there).
with gate as (
    -- the similarity gate: the nearest currently valid memory, when it is at least
    -- dedup_threshold similar (no gate without a threshold or a vector)
    select n.memory_id, n.similarity
      from harbor.nearest_current_memory(%(tenant_id)s::text, %(scope)s::harbor.memory_scope,
                                         %(project_id)s::text, %(user_id)s::text,
                                         %(session_id)s::text, %(run_id)s::text,
                                         %(model_id)s::text, %(dims)s::integer,
                                         %(embedding)s::public.vector,
                                         %(exclude_ids)s::text[]) n
     where %(dedup_threshold)s::double precision is not null
       and n.similarity >= %(dedup_threshold)s::double precision
       -- (never a memory past its expiry: the function reads current intervals only)
       and not exists (select 1 from harbor.memories x
                         where x.tenant_id = %(tenant_id)s::text and x.id = n.memory_id
                           and x.expires_at <= pg_catalog.now())
), expired as materialized (
    update harbor.memories d
       set valid = case when d.expires_at > pg_catalog.lower(d.valid)
                        then pg_catalog.tstzrange(pg_catalog.lower(d.valid), d.expires_at, '[)')
                        -- (an expiry at or before the start: the start alone, never empty)
                        else pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                                  pg_catalog.lower(d.valid), '[]') end
     where d.tenant_id = %(tenant_id)s::text
       and d.expires_at is not null and d.expires_at <= pg_catalog.now()
       and pg_catalog.upper_inf(d.valid)
       and d.user_id = %(user_id)s::text and d.project_id = %(project_id)s::text
       and d.session_id = %(session_id)s::text and d.run_id = %(run_id)s::text
       and d.content_hash = %(content_hash)s::text and d.scope = %(scope)s::harbor.memory_scope
       and not exists (select 1 from gate)
    returning d.id
), inserted as (
    insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                                 principal_id, memory_type, importance, content, content_hash,
                                 context, entity_ids, source, sensitivity, source_session_id,
                                 source_message_ids, metadata, valid)
    select %(tenant_id)s::text, coalesce(%(id)s::text, (pg_catalog.gen_random_uuid())::text),
           %(scope)s::harbor.memory_scope, %(project_id)s::text, %(user_id)s::text,
           %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
           %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
           %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
           %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
           %(source_message_ids)s::text[], %(metadata)s::jsonb,
           tstzrange(coalesce(%(valid_from)s::timestamptz, pg_catalog.now()), null, '[)')
     where not exists (select 1 from gate)
       and (select count(*) from expired) >= 0
    on conflict do nothing
    returning *
), embedded as (
    insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding, scope,
                                          project_id, user_id, session_id, run_id)
    select i.tenant_id, i.id, %(model_id)s::text, %(dims)s::integer,
           %(embedding)s::public.vector, i.scope, i.project_id, i.user_id, i.session_id,
           i.run_id
      from inserted i
     where %(embedding)s::public.vector is not null
)
select g.memory_id as restatement_of, g.similarity as restatement_similarity,
       i.id, i.tenant_id, i.scope::text as scope, i.project_id, i.principal_id, i.user_id,
       i.session_id, i.run_id, i.memory_type::text as memory_type, i.content, i.content_hash,
       i.importance, i.entity_ids, i.source, i.sensitivity::text as sensitivity,
       lower(i.valid) as valid_from, upper(i.valid) as invalid_at, i.superseded_by,
       i.source_session_id, i.source_message_ids, i.metadata, i.context, i.created_at,
       i.updated_at
  from (select) one
  left join gate g on true
  left join inserted i on true

-- name: extraction_supersede_memory
-- Behind the similarity gate (excluding the replaced memory; a NULL dedup_threshold: no
-- gate): when the gate finds a memory at least dedup_threshold similar, nothing is locked
-- or written and it comes back as restatement_of (found is then false). Otherwise:
-- In one statement: lock the replaced memory (currently valid, not yet superseded, same scope
-- and owner key as the successor), insert the successor valid from now() with its vector (when
-- given), close the old interval at now() and link it. A concurrent superseder that won the
-- lock first makes the re-checked lock find nothing, so nothing is written (found = false). A
-- successor whose content is already currently valid inserts nothing and closes nothing
-- (found, id null). Always one row: found, then the successor's columns.
-- The gate and the insert repeat extraction_insert_memory's on purpose: each statement
-- is one round trip. Change the two together.
with gate as (
    -- the similarity gate: the nearest currently valid memory, when it is at least
    -- dedup_threshold similar (no gate without a threshold or a vector)
    select n.memory_id, n.similarity
      from harbor.nearest_current_memory(%(tenant_id)s::text, %(scope)s::harbor.memory_scope,
                                         %(project_id)s::text, %(user_id)s::text,
                                         %(session_id)s::text, %(run_id)s::text,
                                         %(model_id)s::text, %(dims)s::integer,
                                         %(embedding)s::public.vector,
                                         %(exclude_ids)s::text[]) n
     where %(dedup_threshold)s::double precision is not null
       and n.similarity >= %(dedup_threshold)s::double precision
       -- (never a memory past its expiry: the function reads current intervals only)
       and not exists (select 1 from harbor.memories x
                         where x.tenant_id = %(tenant_id)s::text and x.id = n.memory_id
                           and x.expires_at <= pg_catalog.now())
), target as (
    select m.tenant_id, m.id
      from harbor.memories m
     where m.tenant_id = %(tenant_id)s::text and m.id = %(replaces)s::text
       and m.scope = %(scope)s::harbor.memory_scope and m.project_id = %(project_id)s::text
       and m.user_id = %(user_id)s::text and m.session_id = %(session_id)s::text
       and m.run_id = %(run_id)s::text
       and m.memory_type <> 'summary'
       and m.superseded_by is null
       and upper_inf(m.valid) and lower(m.valid) < pg_catalog.now()
       and not exists (select 1 from gate)
       for update
), inserted as (
    insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                                 principal_id, memory_type, importance, content, content_hash,
                                 context, entity_ids, source, sensitivity, source_session_id,
                                 source_message_ids, metadata, valid)
    select %(tenant_id)s::text, coalesce(%(id)s::text, (pg_catalog.gen_random_uuid())::text),
           %(scope)s::harbor.memory_scope, %(project_id)s::text, %(user_id)s::text,
           %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
           %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
           %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
           %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
           %(source_message_ids)s::text[], %(metadata)s::jsonb,
           tstzrange(pg_catalog.now(), null, '[)')
      from target
    on conflict do nothing
    returning *
), embedded as (
    insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding, scope,
                                          project_id, user_id, session_id, run_id)
    select i.tenant_id, i.id, %(model_id)s::text, %(dims)s::integer,
           %(embedding)s::public.vector, i.scope, i.project_id, i.user_id, i.session_id,
           i.run_id
      from inserted i
     where %(embedding)s::public.vector is not null
), closed as (
    update harbor.memories m
       set valid = tstzrange(lower(m.valid), pg_catalog.now(), '[)'),
           superseded_by = i.id
      from target t, inserted i
     where m.tenant_id = t.tenant_id and m.id = t.id
    returning m.id
)
select (select g.memory_id from gate g) as restatement_of,
       (select g.similarity from gate g) as restatement_similarity,
       exists (select 1 from target) as found, (select c.id from closed c) as closed_id,
       i.id, i.tenant_id, i.scope::text as scope, i.project_id, i.principal_id, i.user_id,
       i.session_id, i.run_id, i.memory_type::text as memory_type, i.content, i.content_hash,
       i.importance, i.entity_ids, i.source, i.sensitivity::text as sensitivity,
       lower(i.valid) as valid_from, upper(i.valid) as invalid_at, i.superseded_by,
       i.source_session_id, i.source_message_ids, i.metadata, i.context, i.created_at,
       i.updated_at
  from (select) one
  left join inserted i on true

-- name: close_memory
-- End one current memory's interval now, with no successor (an observation whose facts
-- fell away): only a currently valid, not yet superseded, non-summary memory of the scope
-- and owner key given, valid from before now. The memories_add_only trigger allows
-- exactly this (an open interval closed). Returns its id when it was closed.
update harbor.memories m
   set valid = tstzrange(lower(m.valid), pg_catalog.now(), '[)')
 where m.tenant_id = %(tenant_id)s::text and m.id = %(id)s::text
   and m.scope = %(scope)s::harbor.memory_scope and m.project_id = %(project_id)s::text
   and m.user_id = %(user_id)s::text and m.session_id = %(session_id)s::text
   and m.run_id = %(run_id)s::text
   and m.memory_type <> 'summary'
   and m.superseded_by is null
   and upper_inf(m.valid) and lower(m.valid) < pg_catalog.now()
returning m.id

-- name: job_write_lock
-- The lock of the caller's session (its row of harbor.owner_locks, as an append takes
-- it), first in a queued job's write transaction: an erasure of the session's user,
-- session or agent holds it from its start to its commit (harbor.erase).
with session_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, %(session_id)s::text, 'session')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
)
select count(*) from session_lock

-- name: job_turn_present
-- After job_write_lock, in a statement of its own: the job's turn is still there, or
-- the transaction fails (no_data_found) and writes nothing.
select harbor.require_turn(%(turn_id)s::bigint)

-- name: job_user_lock
-- The caller's user's row of harbor.owner_locks (scope 'user', as an append takes it),
-- first in the transaction of a write derived from the user's memories (an
-- observation): an erasure of the user holds it from its start to its commit
-- (harbor.erase), so the statement after this one sees what the erasure deleted. Taken
-- as job_write_lock takes the session's (a user's appends wait for this write's
-- transaction, and it for theirs: both are one statement long).
with user_lock as (
    insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)
    values (%(tenant_id)s::text, %(user_id)s::text, '', 'user')
    on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)
    do update set scope = excluded.scope where false
    returning 1
)
select count(*) from user_lock

-- name: job_memories_present
-- After job_user_lock, in a statement of its own: the memories the write was derived
-- from are all still stored, or the transaction fails (no_data_found) and writes nothing.
select harbor.require_memories(%(ids)s::text[])
