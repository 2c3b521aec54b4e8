-- Export and import of memories as JSON Lines (harbor_pg/portability.py).

-- name: export_memories
-- Every memory the caller may read in the tenant (all validity history), except GLOBAL rows
-- and, for a bound identity (not elevated), TENANT rows; successors before the rows they
-- superseded (a successor starts when its predecessor ends), so an import can link them.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.context, m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.created_at, m.updated_at,
       m.expires_at
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text
   and (%(elevated)s::boolean or m.scope <> 'tenant')
 order by lower(m.valid) desc, m.id

-- name: export_vectors
-- The stored vectors of some memories (float4 components as a real[]).
select e.memory_id, e.model_id, e.with_context, e.embedding::real[] as embedding
  from harbor.memory_embeddings e
 where e.tenant_id = %(tenant_id)s::text and e.memory_id = any (%(ids)s::text[])
 order by e.memory_id, e.model_id, e.with_context

-- name: import_memory
-- Insert one exported memory as it was (id, validity, timestamps); nothing when a row with
-- its id, or a currently valid duplicate, exists. The successor link is kept when the
-- successor is there (export order puts it first), else dropped.
insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                             principal_id, memory_type, importance, content, content_hash,
                             context, entity_ids, source, sensitivity, valid, superseded_by,
                             source_session_id, source_message_ids, metadata, created_at,
                             updated_at, expires_at)
values (%(tenant_id)s::text, %(id)s::text, %(scope)s::harbor.memory_scope, %(project_id)s::text,
        %(user_id)s::text, %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
        %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
        %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
        %(sensitivity)s::harbor.sensitivity,
        tstzrange(%(valid_from)s::timestamptz, %(invalid_at)s::timestamptz, '[)'),
        (select s.id from harbor.memories s
          where s.tenant_id = %(tenant_id)s::text and s.id = %(superseded_by)s::text),
        %(source_session_id)s::text, %(source_message_ids)s::text[], %(metadata)s::jsonb,
        %(created_at)s::timestamptz, %(updated_at)s::timestamptz,
        %(expires_at)s::timestamptz)
on conflict do nothing
returning id
