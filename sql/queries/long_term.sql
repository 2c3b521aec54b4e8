-- name: insert_memory
-- Insert a memory; nothing when a currently valid duplicate exists (exclusion constraint).
insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                             principal_id, memory_type, importance, content, content_hash,
                             context, entity_ids, source, sensitivity, source_session_id,
                             source_message_ids, metadata, valid)
values (%(tenant_id)s::text, coalesce(%(id)s::text, (pg_catalog.gen_random_uuid())::text),
        %(scope)s::harbor.memory_scope, %(project_id)s::text, %(user_id)s::text,
        %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
        %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
        %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
        %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
        %(source_message_ids)s::text[], %(metadata)s::jsonb,
        tstzrange(coalesce(%(valid_from)s::timestamptz, pg_catalog.now()), null, '[)'))
on conflict do nothing
returning id

-- name: find_current_duplicate
-- The memory that blocked insert_memory: same owner key and content hash, validity overlapping
-- the new row's. Overlap, not "valid at now()": a concurrent writer whose transaction began
-- after ours holds a row that starts after our now().
select id from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.scope = %(scope)s::harbor.memory_scope
   and m.project_id = %(project_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text and m.run_id = %(run_id)s::text
   and m.content_hash = %(content_hash)s::text
   and m.valid && tstzrange(coalesce(%(valid_from)s::timestamptz, pg_catalog.now()), null, '[)')
 order by lower(m.valid)
 limit 1

-- name: insert_embedding
-- Store one vector of a memory for one model (owner key copied from the memory): of the
-- content alone, or (with_context) of the context line followed by the content. Only for a
-- memory this transaction created, so no vector of it can exist yet: no ON CONFLICT clause,
-- which would need the right to read the row it conflicts with (the elevated role may not
-- read GLOBAL vectors, so a GLOBAL memory could not be saved with one).
insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding, scope,
                                      project_id, user_id, session_id, run_id, with_context)
select m.tenant_id, m.id, %(model_id)s::text, %(dims)s::integer, %(embedding)s::public.vector,
       m.scope, m.project_id, m.user_id, m.session_id, m.run_id, %(with_context)s::boolean
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.id = %(memory_id)s::text

-- name: get_memory
-- One memory by id, if the caller may see it.
-- Every statement that returns memories lists their columns the same way (get_memory,
-- search_memories, extraction_current_memories, context_load_summary): the columns
-- memory_from_row reads. Adding a field: docs/architecture.md.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text]) and m.id = %(id)s::text

-- name: delete_memory
-- Delete one of the caller's own memories (its embeddings go with it).
delete from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.id = %(id)s::text
returning m.id

-- name: erase
-- Right to erasure in the caller's tenant (elevated role): counts per tier.
select tier, deleted from harbor.erase(%(user_id)s::text, %(session_id)s::text,
                                       %(principal_id)s::text)

-- name: apply_retention
-- Purge the tenant's expired working state and, with an age, delete its memories past it
-- (optionally per scope / sensitivity).
select r.working_state, r.memories
  from harbor.apply_retention(make_interval(secs => %(max_age_seconds)s::double precision),
                              %(scope)s::harbor.memory_scope,
                              %(min_sensitivity)s::harbor.sensitivity,
                              %(include_summaries)s::boolean) r

-- name: search_memories
-- Lexical search (OR semantics) with a substring fallback, valid at as_of; no summaries.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at
  from harbor.memories m,
       (select harbor.or_tsquery(%(query)s::text) as tsq) q
 where m.tenant_id = any (array['', %(tenant_id)s::text])
   and m.valid @> coalesce(%(as_of)s::timestamptz, pg_catalog.now())
   and m.memory_type <> 'summary'
   and (m.fts @@ q.tsq
        or pg_catalog.strpos(pg_catalog.lower(m.content), pg_catalog.lower(%(query)s::text)) > 0)
 order by pg_catalog.ts_rank_cd(m.fts, q.tsq) desc, m.importance desc, lower(m.valid) desc
 limit %(limit)s::integer
