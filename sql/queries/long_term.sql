-- name: insert_memory
-- Insert a memory; nothing when a currently valid duplicate exists (the unique index
-- memories_no_duplicate_current). A duplicate past its expiry is closed first, as in
-- save_memories.
with expired as materialized (
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
    returning d.id
)
insert into harbor.memories (tenant_id, id, scope, project_id, user_id, session_id, run_id,
                             principal_id, memory_type, importance, content, content_hash,
                             context, entity_ids, source, sensitivity, source_session_id,
                             source_message_ids, metadata, valid, expires_at)
select %(tenant_id)s::text, coalesce(%(id)s::text, (pg_catalog.gen_random_uuid())::text),
       %(scope)s::harbor.memory_scope, %(project_id)s::text, %(user_id)s::text,
       %(session_id)s::text, %(run_id)s::text, %(principal_id)s::text,
       %(memory_type)s::harbor.memory_type, %(importance)s::real, %(content)s::text,
       %(content_hash)s::text, %(context)s::text, %(entity_ids)s::text[], %(source)s::text,
       %(sensitivity)s::harbor.sensitivity, %(source_session_id)s::text,
       %(source_message_ids)s::text[], %(metadata)s::jsonb,
       tstzrange(coalesce(%(valid_from)s::timestamptz, pg_catalog.now()), null, '[)'),
       %(expires_at)s::timestamptz
 where (select count(*) from expired) >= 0
on conflict do nothing
returning id

-- name: close_expired_duplicates
-- Close, at its expiry, each current memory past its expiry under these owner keys and
-- content hashes (one array element per key): a duplicate save_memories did not return
-- because it has expired while no sweep has closed it yet. Returns their ids.
update harbor.memories d
   set valid = case when d.expires_at > pg_catalog.lower(d.valid)
                    then pg_catalog.tstzrange(pg_catalog.lower(d.valid), d.expires_at, '[)')
                    else pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                              pg_catalog.lower(d.valid), '[]') end
  from unnest(%(tenant_ids)s::text[], %(scopes)s::harbor.memory_scope[],  -- (only unqualified)
              %(project_ids)s::text[], %(user_ids)s::text[], %(session_ids)s::text[],
              %(run_ids)s::text[], %(content_hashes)s::text[])
       as k(tenant_id, scope, project_id, user_id, session_id, run_id, content_hash)
 where d.tenant_id = k.tenant_id and d.user_id = k.user_id and d.project_id = k.project_id
   and d.session_id = k.session_id and d.run_id = k.run_id
   and d.content_hash = k.content_hash and d.scope = k.scope
   and d.expires_at is not null and d.expires_at <= pg_catalog.now()
   and pg_catalog.upper_inf(d.valid)
returning d.id

-- name: find_current_duplicate
-- The memory that blocked insert_memory: same owner key and content hash, interval open (what
-- memories_no_duplicate_current holds). Open, not "valid at now()": a concurrent writer whose
-- transaction began after ours holds a row that starts after our now().
select id from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.scope = %(scope)s::harbor.memory_scope
   and m.project_id = %(project_id)s::text and m.user_id = %(user_id)s::text
   and m.session_id = %(session_id)s::text and m.run_id = %(run_id)s::text
   and m.content_hash = %(content_hash)s::text
   and upper_inf(m.valid)

-- name: insert_embedding
-- Store one vector of a memory for one model (owner key copied from the memory): of the
-- content alone, or (with_context) of the context line followed by the content. Only for a
-- memory this transaction created, so no vector of it can exist yet: no ON CONFLICT clause,
-- which would need the right to read the row it conflicts with (the elevated role may not
-- read GLOBAL vectors, so a GLOBAL memory could not be saved with one).
-- In the HNSW graph when the owner key's vectors are (memory_embeddings.in_graph), or
-- when every vector is (graph_min_vectors() 0: on a distributed database); a key this
-- write brings to the graph's size is promoted by the next save_memories to it.
insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding, scope,
                                      project_id, user_id, session_id, run_id, with_context,
                                      in_graph)
select m.tenant_id, m.id, %(model_id)s::text, %(dims)s::integer, %(embedding)s::public.vector,
       m.scope, m.project_id, m.user_id, m.session_id, m.run_id, %(with_context)s::boolean,
       exists (select 1 from harbor.memory_embeddings e
                where e.tenant_id = m.tenant_id and e.model_id = %(model_id)s::text
                  and e.scope = m.scope and e.user_id = m.user_id
                  and e.project_id = m.project_id and e.session_id = m.session_id
                  and e.run_id = m.run_id and e.in_graph)
       or harbor.graph_min_vectors() <= 0
  from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.id = %(memory_id)s::text

-- name: get_memory
-- One memory by id, if the caller may see it.
-- Every statement that returns memories lists their columns the same way, on purpose
-- (each statement stands alone): search_memories, extraction_current_memories,
-- context_load_summary, memory_history in this order, export_memories and inspect_memory
-- as a set; tests/unit/test_sql_twins.py holds them to this list, the columns
-- memory_from_row reads. Adding a field: docs/architecture.md.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text]) and m.id = %(id)s::text

-- name: get_memories
-- The memories of these ids the caller may see (a change announced on its tenant's
-- channel, read back before MemoryManager.watch hands it on); get_memory's columns.
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from harbor.memories m
 where m.tenant_id = any (array['', %(tenant_id)s::text]) and m.id = any (%(ids)s::text[])

-- name: delete_memory
-- Delete one of the caller's own memories (its embeddings go with it).
delete from harbor.memories m
 where m.tenant_id = %(tenant_id)s::text and m.id = %(id)s::text
returning m.id

-- name: erase
-- Right to erasure in the caller's tenant (elevated role): counts per tier.
select tier, deleted from harbor.erase(%(user_id)s::text, %(session_id)s::text,
                                       %(principal_id)s::text)

-- name: erase_delegated
-- erase on a distributed database where nothing of the subject lies off the tenant's shards:
-- one call of harbor.erase_delegated (sql/citus/erase.sql), which Citus sends whole to the
-- tenant's worker, in the transaction that erase_jobs_citus then ends. The identity is its
-- first arguments (the worker checks them against the caller's). Refused (55000) when
-- harbor.erase is needed.
select d.tier, d.deleted
  from harbor.erase_delegated(
      %(tenant_id)s::text, %(project_id)s::text, %(principal_id)s::text, %(user_id)s::text,
      %(session_id)s::text, %(run_id)s::text, %(erase_user_id)s::text,
      %(erase_session_id)s::text, %(erase_principal_id)s::text) d

-- name: erase_jobs_citus
-- The erased subject's jobs on the queue (the coordinator's tables), in the transaction of
-- erase_delegated, as harbor.erase deletes them: pending, finished and failed alike.
delete from harbor_jobs.procrastinate_jobs j
 where j.args ->> 'tenant_id' = %(tenant_id)s::text
   and (%(erase_user_id)s::text is null or j.args ->> 'user_id' = %(erase_user_id)s::text
        or j.args ->> 'principal_id' = %(erase_user_id)s::text)
   and (%(erase_session_id)s::text is null
        or j.args ->> 'session_id' = %(erase_session_id)s::text)
   and (%(erase_principal_id)s::text is null
        or j.args ->> 'principal_id' = %(erase_principal_id)s::text)

-- name: apply_retention
-- Purge the tenant's expired working state, close its expired memories and, with an age,
-- delete its memories past it (optionally per scope / sensitivity).
select r.working_state, r.memories, r.expired
  from harbor.apply_retention(make_interval(secs => %(max_age_seconds)s::double precision),
                              %(scope)s::harbor.memory_scope,
                              %(min_sensitivity)s::harbor.sensitivity,
                              %(include_summaries)s::boolean) r

-- name: expire_memories
-- Close the expired memories the caller may write (with no identity, as the elevated
-- role: every tenant's): their intervals end at their expiry.
select harbor.expire_memories() as closed

-- name: search_memories
-- Lexical search (OR semantics) with a substring fallback, valid (and not expired) at
-- as_of; no summaries.
-- The caller's memories are read per owner key (harbor._recall_keys, every scope, the
-- identity as the policies read it), an index range scan each, both tenants a key may
-- name ('' and the caller's, as the policies allow); the policies still filter each row.
-- A read of the tenant's rows tested every user's memories of the tenant with the policy
-- as a filter (a 100-memory owner's search beside a user of 100,000: 38 ms). On a
-- distributed database, search_delegated and search_global (sql/queries/citus.sql).
-- get_memory's column list, repeated on purpose (see there).
select m.id, m.tenant_id, m.scope::text as scope, m.project_id, m.principal_id, m.user_id,
       m.session_id, m.run_id, m.memory_type::text as memory_type, m.content, m.content_hash,
       m.importance, m.entity_ids, m.source, m.sensitivity::text as sensitivity,
       lower(m.valid) as valid_from, upper(m.valid) as invalid_at, m.superseded_by,
       m.source_session_id, m.source_message_ids, m.metadata, m.context, m.created_at,
       m.updated_at, m.expires_at
  from (select harbor.or_tsquery(%(query)s::text) as tsq) q,
       harbor._caller_identity() i
 cross join lateral harbor._recall_keys('{global,tenant,project,user,session,run}',
                                        i.tenant_id, i.project_id, i.user_id, i.session_id,
                                        i.run_id) k
 cross join lateral (
     select m.*
       from harbor.memories m
      where m.tenant_id = any (array['', k.tenant_id]) and m.scope = k.scope
        and m.user_id = k.user_id and m.project_id = k.project_id
        and m.session_id = k.session_id and m.run_id = k.run_id
     offset 0) m
 where m.tenant_id = any (array['', %(tenant_id)s::text])
   and m.valid @> coalesce(%(as_of)s::timestamptz, pg_catalog.now())
   and not coalesce(m.expires_at <= coalesce(%(as_of)s::timestamptz, pg_catalog.now()), false)
   and m.memory_type <> 'summary'
   and (m.fts @@ q.tsq
        or pg_catalog.strpos(pg_catalog.lower(m.content), pg_catalog.lower(%(query)s::text)) > 0)
 order by pg_catalog.ts_rank_cd(m.fts, q.tsq) desc, m.importance desc, lower(m.valid) desc,
          m.id collate "C"
 limit %(limit)s::integer

-- name: save_memories
-- Save a batch of memories with their vectors in one statement (save_many: one round trip
-- with the identity; a save of one memory runs save_memory, its twin below). Each array has one element per memory, in the order the
-- rows are inserted and locked (the caller sorts them by dedup key, so that two batches of
-- the same facts wait for each other instead of deadlocking); ids are distinct within a
-- call. A memory is inserted unless a currently valid duplicate exists (the unique index
-- memories_no_duplicate_current decides, also under concurrent writers: ON CONFLICT DO
-- NOTHING); then that
-- duplicate comes back instead, with created false: one this statement inserted earlier,
-- or one its snapshot sees. A duplicate it cannot see (a concurrent writer's, committed
-- after the statement began) comes back as a row with a null id: the caller looks it up
-- with find_current_duplicate; so does one past its expiry whose interval is still open
-- (the sweep has not reached it): the caller closes it (close_expired_duplicates) and
-- saves the memory again. Vectors: embeddings[i] of memory i's content,
-- context_embeddings[i] of its context line and content (each may be null), both of
-- model_id; stored only for a memory inserted here (no vector of it can exist yet, so no
-- ON CONFLICT clause, which would need the right to read the row it conflicts with).
-- entity_ids and source_message_ids: one JSON array of strings per memory.
-- One row per memory, in input order (ord).
with input as materialized (
    select u.ord,
           -- a session summary's id is the one the memories_summary_id trigger gives it
           -- (derived from its owner), so that the inserted row matches its input by id
           case when u.scope = 'session' and u.memory_type = 'summary'
                then harbor.summary_id(u.tenant_id, u.project_id, u.user_id, u.session_id,
                                       u.run_id)
                else coalesce(u.id, (pg_catalog.gen_random_uuid())::text) end as id,
           u.tenant_id,
           u.scope, u.project_id, u.user_id, u.session_id, u.run_id, u.principal_id,
           u.memory_type, u.importance, u.content, u.content_hash, u.context, u.entity_ids,
           u.source, u.sensitivity, u.source_session_id, u.source_message_ids, u.metadata,
           pg_catalog.tstzrange(coalesce(u.valid_from, pg_catalog.now()), null, '[)') as valid,
           u.expires_at, u.embedding, u.context_embedding
      from unnest(  -- the multi-array form, only unqualified
               %(tenant_ids)s::text[], %(ids)s::text[], %(scopes)s::harbor.memory_scope[],
               %(project_ids)s::text[], %(user_ids)s::text[], %(session_ids)s::text[],
               %(run_ids)s::text[], %(principal_ids)s::text[],
               %(memory_types)s::harbor.memory_type[], %(importances)s::real[],
               %(contents)s::text[], %(content_hashes)s::text[], %(contexts)s::text[],
               %(entity_ids)s::jsonb[], %(sources)s::text[],
               %(sensitivities)s::harbor.sensitivity[], %(source_session_ids)s::text[],
               %(source_message_ids)s::jsonb[], %(metadata)s::jsonb[],
               %(valid_froms)s::timestamptz[], %(expires_ats)s::timestamptz[],
               %(embeddings)s::public.vector[], %(context_embeddings)s::public.vector[])
           with ordinality as u(tenant_id, id, scope, project_id, user_id, session_id, run_id,
                                principal_id, memory_type, importance, content, content_hash,
                                context, entity_ids, source, sensitivity, source_session_id,
                                source_message_ids, metadata, valid_from, expires_at,
                                embedding, context_embedding, ord)
), inserted as (
    insert into harbor.memories as m (tenant_id, id, scope, project_id, user_id, session_id,
                                      run_id, principal_id, memory_type, importance, content,
                                      content_hash, context, entity_ids, source, sensitivity,
                                      source_session_id, source_message_ids, metadata, valid,
                                      expires_at)
    select i.tenant_id, i.id, i.scope, i.project_id, i.user_id, i.session_id, i.run_id,
           i.principal_id, i.memory_type, i.importance, i.content, i.content_hash, i.context,
           array(select pg_catalog.jsonb_array_elements_text(i.entity_ids)), i.source,
           i.sensitivity, i.source_session_id,
           array(select pg_catalog.jsonb_array_elements_text(i.source_message_ids)),
           i.metadata, i.valid, i.expires_at
      from input i
     order by i.ord
    on conflict do nothing
    returning m
), owners as materialized (
    -- The owner keys given vectors, each with whether its new vectors go in the HNSW
    -- graph (memory_embeddings.in_graph) and whether its older rows are to be promoted
    -- (harbor.promote_vector_owner): harbor.vector_owner_graph decides, once a key (a
    -- count that comes out short only leaves a key out of the graph, where the dense
    -- leg scans it exactly). A key outside the graph is counted when the batch gives it
    -- at least sixteen vectors or one of its memory ids is sampled (one in sixteen, by
    -- hash): the count reads up to the graph's size of the key's entries.
    select k.*, s.in_graph, s.promote
      from (select i.tenant_id, i.scope, i.user_id, i.project_id, i.session_id, i.run_id,
                   count(i.embedding) + count(i.context_embedding) as vectors,
                   bool_or((pg_catalog.hashtext(i.id) & 15) = 0) as sampled
              from input i
             where i.embedding is not null or i.context_embedding is not null
             group by i.tenant_id, i.scope, i.user_id, i.project_id, i.session_id,
                      i.run_id) k
     cross join lateral harbor.vector_owner_graph(k.tenant_id, %(model_id)s::text, k.scope,
                                                  k.user_id, k.project_id, k.session_id,
                                                  k.run_id, k.vectors::integer,
                                                  k.vectors >= 16 or k.sampled) s
), embedded as (
    insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                          scope, project_id, user_id, session_id, run_id,
                                          with_context, in_graph)
    select (n.m).tenant_id, (n.m).id, %(model_id)s::text, public.vector_dims(v.embedding),
           v.embedding, (n.m).scope, (n.m).project_id, (n.m).user_id, (n.m).session_id,
           (n.m).run_id, v.with_context, o.in_graph
      from inserted n
      join input i on i.id = (n.m).id and i.tenant_id = (n.m).tenant_id
      join owners o
        on o.tenant_id = (n.m).tenant_id and o.scope = (n.m).scope
       and o.user_id = (n.m).user_id and o.project_id = (n.m).project_id
       and o.session_id = (n.m).session_id and o.run_id = (n.m).run_id
     cross join lateral (values (i.embedding, false), (i.context_embedding, true))
           as v(embedding, with_context)
     where v.embedding is not null
), promoted as (
    -- in key order (each promotion tries its key's lock and never waits: a key another
    -- write is promoting is left to a later write)
    select pg_catalog.sum(harbor.promote_vector_owner(o.tenant_id, %(model_id)s::text, o.scope,
                                                      o.user_id, o.project_id, o.session_id,
                                                      o.run_id, o.vectors::integer)
                          order by o.tenant_id, o.scope, o.user_id, o.project_id,
                                   o.session_id, o.run_id) as n
      from owners o
     where o.promote
), saved as materialized (
    select i.ord, (n.m).id is not null as created,
           coalesce(n.m,
                    -- the duplicate: inserted earlier in this statement, or visible to it
                    (select x.m
                       from (select e.m, 0 as here
                               from inserted e
                              where (e.m).tenant_id = i.tenant_id and (e.m).scope = i.scope
                                and (e.m).project_id = i.project_id
                                and (e.m).user_id = i.user_id
                                and (e.m).session_id = i.session_id
                                and (e.m).run_id = i.run_id
                                and (e.m).content_hash = i.content_hash
                             union all
                             -- (the unique index's key; its rows are the open ones)
                             select d, 1
                               from harbor.memories d
                              where d.tenant_id = i.tenant_id and d.user_id = i.user_id
                                and d.project_id = i.project_id
                                and d.session_id = i.session_id and d.run_id = i.run_id
                                and d.content_hash = i.content_hash and d.scope = i.scope
                                and pg_catalog.upper_inf(d.valid)
                                -- (not one past its expiry: the caller closes it, and
                                -- saves the memory again, close_expired_duplicates)
                                and not coalesce(d.expires_at <= pg_catalog.now(), false)) x
                      order by x.here
                      limit 1)) as m
      from input i
      left join inserted n on (n.m).id = i.id and (n.m).tenant_id = i.tenant_id
)
select s.ord, s.created, (s.m).id, (s.m).tenant_id, (s.m).scope::text as scope,
       (s.m).project_id, (s.m).principal_id, (s.m).user_id, (s.m).session_id, (s.m).run_id,
       (s.m).memory_type::text as memory_type, (s.m).content, (s.m).content_hash,
       (s.m).importance, (s.m).entity_ids, (s.m).source,
       (s.m).sensitivity::text as sensitivity, pg_catalog.lower((s.m).valid) as valid_from,
       pg_catalog.upper((s.m).valid) as invalid_at, (s.m).superseded_by,
       (s.m).source_session_id, (s.m).source_message_ids, (s.m).metadata, (s.m).context,
       (s.m).created_at, (s.m).updated_at, (s.m).expires_at
  from saved s
 -- (promoted is read, so that it runs)
 where (select coalesce(p.n, 0) from promoted p) >= 0
 order by s.ord

-- name: save_memory
-- save_memories for one memory (save): the same rules, with one value a parameter
-- (memory_params' names; entity_ids and source_message_ids as text arrays, embedding
-- and context_embedding as vectors, each may be null) instead of an array each. For one
-- memory the arrays cost more than the work: their unnest, the joins and sorts that match
-- a batch's rows to its input, and on the client their conversion. One row, always:
-- the memory inserted (created true); else the currently valid duplicate the statement
-- sees (created false); else nulls, which the caller treats as save_memories' null id.
with input as materialized (
    select case when u.scope = 'session' and u.memory_type = 'summary'
                then harbor.summary_id(u.tenant_id, u.project_id, u.user_id, u.session_id,
                                       u.run_id)
                else coalesce(u.id, (pg_catalog.gen_random_uuid())::text) end as id,
           u.tenant_id, u.scope, u.project_id, u.user_id, u.session_id, u.run_id,
           u.principal_id, u.memory_type, u.importance, u.content, u.content_hash, u.context,
           u.entity_ids, u.source, u.sensitivity, u.source_session_id, u.source_message_ids,
           u.metadata,
           pg_catalog.tstzrange(coalesce(u.valid_from, pg_catalog.now()), null, '[)') as valid,
           u.expires_at, u.embedding, u.context_embedding
      from (select %(tenant_id)s::text as tenant_id, %(id)s::text as id,
                   %(scope)s::harbor.memory_scope as scope, %(project_id)s::text as project_id,
                   %(user_id)s::text as user_id, %(session_id)s::text as session_id,
                   %(run_id)s::text as run_id, %(principal_id)s::text as principal_id,
                   %(memory_type)s::harbor.memory_type as memory_type,
                   %(importance)s::real as importance, %(content)s::text as content,
                   %(content_hash)s::text as content_hash, %(context)s::text as context,
                   %(entity_ids)s::text[] as entity_ids, %(source)s::text as source,
                   %(sensitivity)s::harbor.sensitivity as sensitivity,
                   %(source_session_id)s::text as source_session_id,
                   %(source_message_ids)s::text[] as source_message_ids,
                   %(metadata)s::jsonb as metadata,
                   %(valid_from)s::timestamptz as valid_from,
                   %(expires_at)s::timestamptz as expires_at,
                   %(embedding)s::public.vector as embedding,
                   %(context_embedding)s::public.vector as context_embedding) u
), inserted as (
    insert into harbor.memories as m (tenant_id, id, scope, project_id, user_id, session_id,
                                      run_id, principal_id, memory_type, importance, content,
                                      content_hash, context, entity_ids, source, sensitivity,
                                      source_session_id, source_message_ids, metadata, valid,
                                      expires_at)
    select i.tenant_id, i.id, i.scope, i.project_id, i.user_id, i.session_id, i.run_id,
           i.principal_id, i.memory_type, i.importance, i.content, i.content_hash, i.context,
           i.entity_ids, i.source, i.sensitivity, i.source_session_id, i.source_message_ids,
           i.metadata, i.valid, i.expires_at
      from input i
    on conflict do nothing
    returning m
), owners as materialized (
    -- the owner key's graph decision, as in save_memories (only with a vector; a key
    -- outside the graph counted when the memory id is sampled: one memory's one or
    -- two vectors never reach a batch's sixteen)
    select k.*, s.in_graph, s.promote
      from (select i.tenant_id, i.scope, i.user_id, i.project_id, i.session_id, i.run_id,
                   (i.embedding is not null)::integer
                   + (i.context_embedding is not null)::integer as vectors,
                   (pg_catalog.hashtext(i.id) & 15) = 0 as sampled
              from input i
             where i.embedding is not null or i.context_embedding is not null) k
     cross join lateral harbor.vector_owner_graph(k.tenant_id, %(model_id)s::text, k.scope,
                                                  k.user_id, k.project_id, k.session_id,
                                                  k.run_id, k.vectors, k.sampled) s
), embedded as (
    insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                          scope, project_id, user_id, session_id, run_id,
                                          with_context, in_graph)
    select (n.m).tenant_id, (n.m).id, %(model_id)s::text, public.vector_dims(v.embedding),
           v.embedding, (n.m).scope, (n.m).project_id, (n.m).user_id, (n.m).session_id,
           (n.m).run_id, v.with_context, o.in_graph
      from inserted n
     cross join input i
     cross join owners o
     cross join lateral (values (i.embedding, false), (i.context_embedding, true))
           as v(embedding, with_context)
     where v.embedding is not null
), promoted as (
    select harbor.promote_vector_owner(o.tenant_id, %(model_id)s::text, o.scope, o.user_id,
                                       o.project_id, o.session_id, o.run_id,
                                       o.vectors) as n
      from owners o
     where o.promote
), saved as materialized (
    select n.m, true as created
      from inserted n
    union all
    -- the duplicate that kept it out, when the statement sees it (the unique index's key;
    -- not one past its expiry: the caller closes it and saves the memory again)
    (select d, false
       from input i
       join harbor.memories d
         on d.tenant_id = i.tenant_id and d.user_id = i.user_id
        and d.project_id = i.project_id and d.session_id = i.session_id
        and d.run_id = i.run_id and d.content_hash = i.content_hash and d.scope = i.scope
      where not exists (select from inserted)
        and pg_catalog.upper_inf(d.valid)
        and not coalesce(d.expires_at <= pg_catalog.now(), false)
      limit 1)
)
select 1 as ord, s.created, (s.m).id, (s.m).tenant_id, (s.m).scope::text as scope,
       (s.m).project_id, (s.m).principal_id, (s.m).user_id, (s.m).session_id, (s.m).run_id,
       (s.m).memory_type::text as memory_type, (s.m).content, (s.m).content_hash,
       (s.m).importance, (s.m).entity_ids, (s.m).source,
       (s.m).sensitivity::text as sensitivity, pg_catalog.lower((s.m).valid) as valid_from,
       pg_catalog.upper((s.m).valid) as invalid_at, (s.m).superseded_by,
       (s.m).source_session_id, (s.m).source_message_ids, (s.m).metadata, (s.m).context,
       (s.m).created_at, (s.m).updated_at, (s.m).expires_at
  from (select) one
  left join saved s on true
 -- (promoted is read, so that it runs)
 where (select coalesce(pg_catalog.sum(p.n), 0) from promoted p) >= 0
