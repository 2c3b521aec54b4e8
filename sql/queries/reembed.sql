-- name: reembed_owner_keys
-- Re-embedding (harbor_pg.reembed), as the elevated role with the tenant's identity: the
-- owner keys of the tenant's memories (GLOBAL ones aside) that have a content vector of
-- another model and none of model_id, how many such memories each holds, and one author
-- of them (the identity a PROJECT key's backfill runs as).
select m.scope::text as scope, m.project_id, m.user_id, m.session_id, m.run_id,
       pg_catalog.min(m.principal_id) as principal_id, pg_catalog.count(*) as missing
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text
   and m.scope <> 'global'
   and exists (select 1 from harbor.memory_embeddings o
                where o.tenant_id = m.tenant_id and o.memory_id = m.id
                  and o.model_id <> %(model_id)s::text and not o.with_context)
   and not exists (select 1 from harbor.memory_embeddings n
                    where n.tenant_id = m.tenant_id and n.memory_id = m.id
                      and n.model_id = %(model_id)s::text and not n.with_context)
 group by m.scope, m.project_id, m.user_id, m.session_id, m.run_id
 order by m.scope, m.project_id, m.user_id, m.session_id, m.run_id

-- name: reembed_batch
-- The next memories of exactly one owner key, as its owner (row-level security), that have
-- a content vector of another model and none of model_id: id, content and context.
select m.id, m.content, m.context
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.scope = %(scope)s::harbor.memory_scope
   and m.project_id = %(project_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text and m.run_id = %(run_id)s::text
   and exists (select 1 from harbor.memory_embeddings o
                where o.tenant_id = m.tenant_id and o.memory_id = m.id
                  and o.model_id <> %(model_id)s::text and not o.with_context)
   and not exists (select 1 from harbor.memory_embeddings n
                    where n.tenant_id = m.tenant_id and n.memory_id = m.id
                      and n.model_id = %(model_id)s::text and not n.with_context)
 order by m.id
 limit %(limit)s::integer

-- name: reembed_insert
-- A batch of vectors of model_id (owner key copied from each memory), as the memories'
-- owner. A vector written already (a backfill run again after it was stopped) is left as
-- it is: the primary key makes the write idempotent. Outside the HNSW graph (unless every
-- vector is in it, graph_min_vectors() 0): harbor.promote_vector_owner puts a key there
-- once its backfill is done.
insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding, scope,
                                      project_id, user_id, session_id, run_id, with_context,
                                      in_graph)
select m.tenant_id, m.id, %(model_id)s::text, public.vector_dims(v.embedding::public.vector),
       v.embedding::public.vector, m.scope, m.project_id, m.user_id, m.session_id, m.run_id,
       v.with_context, harbor.graph_min_vectors() <= 0
  from rows from (pg_catalog.unnest(%(ids)s::text[]), pg_catalog.unnest(%(embeddings)s::text[]),
                 pg_catalog.unnest(%(with_context)s::boolean[])) as v(id, embedding, with_context)
  join harbor.memories m on m.tenant_id = %(tenant_id)s::text and m.id = v.id
on conflict do nothing

-- name: reembed_promote
-- One chunk of a backfilled owner key's vectors into the HNSW graph, once the key has
-- enough of them (harbor.promote_vector_owner); how many it moved.
select harbor.promote_vector_owner(%(tenant_id)s::text, %(model_id)s::text,
                                   %(scope)s::harbor.memory_scope, %(user_id)s::text,
                                   %(project_id)s::text, %(session_id)s::text,
                                   %(run_id)s::text) as promoted

-- name: reembed_complete
-- Whether every memory the caller can see (GLOBAL ones aside) that has a content vector of
-- previous_model_id has one of model_id too: recall then searches model_id's vectors.
select not exists (
    select 1 from harbor.memory_embeddings o
     where o.tenant_id = %(tenant_id)s::text and o.model_id = %(previous_model_id)s::text
       and not o.with_context and o.scope <> 'global'
       and not exists (select 1 from harbor.memory_embeddings n
                        where n.tenant_id = o.tenant_id and n.memory_id = o.memory_id
                          and n.model_id = %(model_id)s::text and not n.with_context)
) as complete
