-- A memory's save on a distributed database, in one call that Citus delegates whole to
-- the tenant's worker (harbor-pg distribute registers it with create_distributed_function,
-- distribution argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus).
-- The coordinator sends the one call, in autocommit: no transaction block, no SET LOCAL,
-- no commit round trip; the worker runs the save's steps on its own shards and commits.
-- The statements it replaces (sql/queries/citus.sql: insert_memory_citus, and when a
-- duplicate is in the way close_expired_duplicate_citus and find_current_duplicate,
-- insert_embedding for each vector, get_memory_citus's read-back) were each sent from the
-- coordinator inside a transaction, a hop and two plannings each.
--
-- The identity travels as the call's first arguments, as harbor.append_turn's does
-- (sql/citus/append.sql): the function sets it (SET LOCAL, for the worker's
-- transaction) and checks it against what the policies read, harbor.caller_tenant(),
-- caller_user() and caller_session(), which give a bound role's binding whatever was set.
-- A caller that names another tenant (the distribution argument), user or session than
-- its own is refused before any row is read or written. The statements then run as the
-- caller (security invoker), under the same policies as every other write: the memory's
-- owner key (p_key_*) must be one the caller may write, as on one server.
--
-- Returns the saved memory as get_memory_citus reads it back, and whether this call
-- created it (false: a current duplicate was there, and is returned).
--
-- Three calls share the steps below: save_memory_delegated (one memory) and
-- save_memories_delegated (a batch), the application role's, and
-- save_tenant_memories_delegated (one TENANT memory or a batch of them), the elevated
-- role's, each granted to its role alone. A save that holds a GLOBAL memory (tenant '',
-- another shard, and harbor.global_memory_flag to set in its transaction:
-- sql/citus/global.sql) is not delegated: harbor_pg.tiers.long_term saves it in a
-- transaction of per-row statements on the coordinator.
-- The save's two common statements (the memory's insert, its vectors'), prepared once a
-- connection (harbor._prepare_on_shard, sql/citus/delegated.sql) and run by name, as the
-- append's are (sql/citus/append.sql: why, and what keeps the rules the same): on the
-- worker they address the tenant's own shard tables (harbor.memories_NNN,
-- harbor.memory_embeddings_NNN), on the coordinator (a call Citus did not delegate) the
-- distributed tables. harbor._save_statements prepares them for p_tenant_id and returns
-- the suffix of their names (the memories shard's id; 'tables' on the coordinator).
create or replace function harbor._save_statements(p_tenant_id text) returns text
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key text := 'tables';
    v_memories text;
    v_vectors text;
    v_names text[];
begin
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.memories'::regclass,
                                                      p_tenant_id)::text;
    end if;
    -- (prepared already: their names are all this needs)
    if harbor._prepared_on_shard('harbor_save_insert_' || v_key) then
        return v_key;
    end if;
    v_memories := harbor._tenant_table('harbor.memories', p_tenant_id);
    v_vectors := harbor._tenant_table('harbor.memory_embeddings', p_tenant_id);
    v_names := array['harbor_save_insert_' || v_key, 'harbor_save_vectors_' || v_key];
    perform harbor._prepare_on_shard(v_names, array[
        format('prepare %s(text, text, harbor.memory_scope, text, text, text, text, text,'
               ' harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity,'
               ' text, text[], jsonb, timestamptz, timestamptz) as insert into %s as m'
               ' (tenant_id, id, scope, project_id, user_id, session_id, run_id, principal_id,'
               ' memory_type, importance, content, content_hash, context, entity_ids, source,'
               ' sensitivity, source_session_id, source_message_ids, metadata, valid,'
               ' expires_at) values ($1, coalesce($2, (pg_catalog.gen_random_uuid())::text),'
               ' $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19,'
               ' pg_catalog.tstzrange(coalesce($20, pg_catalog.now()), null, ''[)''), $21)'
               ' on conflict do nothing returning m.*', v_names[1], v_memories),
        format('prepare %s(text, text, text, harbor.memory_scope, text, text, text, text,'
               ' public.vector, public.vector) as insert into %s (tenant_id, memory_id,'
               ' model_id, dims, embedding, scope, project_id, user_id, session_id, run_id,'
               ' with_context, in_graph) select $1, $2, $3, public.vector_dims(v.e), v.e, $4,'
               ' $5, $6, $7, $8, v.with_context, harbor.graph_min_vectors() <= 0 or exists'
               ' (select 1 from %s e where e.tenant_id = $1 and e.model_id = $3'
               ' and e.scope = $4 and e.user_id = $6 and e.project_id = $5'
               ' and e.session_id = $7 and e.run_id = $8 and e.in_graph)'
               ' from (values ($9, false), ($10, true)) v(e, with_context)'
               ' where v.e is not null', v_names[2], v_vectors, v_vectors)]);
    return v_key;
end
$$;
alter function harbor._save_statements(text) owner to harbor_owner;
revoke all on function harbor._save_statements(text) from public;
grant execute on function harbor._save_statements(text) to harbor_app, harbor_admin;

-- One memory's save on the tenant's shard tables (or, on the coordinator, the distributed
-- tables), for the delegated calls below, once the identity is checked and the statements
-- of harbor._save_statements prepared (p_key: the suffix of their names). The memory is
-- inserted unless a current duplicate is in the way: one past its expiry is closed at its
-- expiry and the memory inserted again (close_expired_duplicate_citus); another comes back
-- instead, with created false (find_current_duplicate). An inserted memory's vectors follow
-- (insert_embedding): of the content, and of the context line followed by the content.
create or replace function harbor._save_memory_on_shard(
    p_key text, p_tenant_id text,
    p_id text, p_scope harbor.memory_scope, p_key_project_id text, p_key_user_id text,
    p_key_session_id text, p_key_run_id text, p_writer_id text,
    p_memory_type harbor.memory_type, p_importance real, p_content text,
    p_content_hash text, p_context text, p_entity_ids text[], p_source text,
    p_sensitivity harbor.sensitivity, p_source_session_id text,
    p_source_message_ids text[], p_metadata jsonb, p_valid_from timestamptz,
    p_expires_at timestamptz, p_model_id text, p_embedding public.vector,
    p_context_embedding public.vector)
    returns table (
        id text, tenant_id text, scope text, project_id text, principal_id text,
        user_id text, session_id text, run_id text, memory_type text, content text,
        content_hash text, importance real, entity_ids text[], source text,
        sensitivity text, valid_from timestamptz, invalid_at timestamptz,
        superseded_by text, source_session_id text, source_message_ids text[],
        metadata jsonb, context text, created_at timestamptz, updated_at timestamptz,
        expires_at timestamptz, created boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_row harbor.memories%rowtype;
    v_created boolean := false;
    v_closed bigint;
    v_mode text := pg_catalog.current_setting('plan_cache_mode');
begin
    -- (the suffix is part of the statements' names below: harbor._save_statements's,
    -- a shard id or 'tables', nothing else)
    if p_key is null or p_key !~ '^([0-9]+|tables)$' then
        raise exception 'harbor._save_memory_on_shard: not a statement suffix'
            using errcode = '22023';
    end if;
    for attempt in 1..2 loop
        -- on the worker, the insert into the shard table with its generic plan, planned
        -- once a connection (sql/citus/delegated.sql); the vectors' insert below keeps
        -- the caller's setting: their owner trigger reads the distributed table
        if p_key <> 'tables' then
            perform pg_catalog.set_config('plan_cache_mode', 'force_generic_plan', true);
        end if;
        execute format('execute harbor_save_insert_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L,'
                       ' %L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L)', p_key,
                       p_tenant_id, p_id, p_scope, p_key_project_id, p_key_user_id,
                       p_key_session_id, p_key_run_id, p_writer_id, p_memory_type,
                       p_importance, p_content, p_content_hash, p_context, p_entity_ids,
                       p_source, p_sensitivity, p_source_session_id, p_source_message_ids,
                       p_metadata, p_valid_from, p_expires_at)
            into v_row;
        perform pg_catalog.set_config('plan_cache_mode', v_mode, true);
        if v_row.id is not null then
            v_created := true;
            exit;
        end if;
        exit when attempt = 2;
        -- a current duplicate past its expiry is closed at its expiry, then the memory
        -- is inserted again (close_expired_duplicate_citus)
        update harbor.memories d
           set valid = case when d.expires_at > pg_catalog.lower(d.valid)
                            then pg_catalog.tstzrange(pg_catalog.lower(d.valid), d.expires_at,
                                                      '[)')
                            else pg_catalog.tstzrange(pg_catalog.lower(d.valid),
                                                      pg_catalog.lower(d.valid), '[]') end
         where d.tenant_id = p_tenant_id
           and d.expires_at is not null and d.expires_at <= pg_catalog.now()
           and pg_catalog.upper_inf(d.valid)
           and d.user_id = p_key_user_id and d.project_id = p_key_project_id
           and d.session_id = p_key_session_id and d.run_id = p_key_run_id
           and d.content_hash = p_content_hash and d.scope = p_scope;
        get diagnostics v_closed = row_count;
        exit when v_closed = 0;
    end loop;
    if v_row.id is null then
        -- the memory that blocked the insert (find_current_duplicate)
        select m.* into v_row from harbor.memories m
         where m.tenant_id = p_tenant_id and m.scope = p_scope
           and m.project_id = p_key_project_id and m.user_id = p_key_user_id
           and m.session_id = p_key_session_id and m.run_id = p_key_run_id
           and m.content_hash = p_content_hash
           and pg_catalog.upper_inf(m.valid);
        if v_row.id is null then
            raise exception 'a conflicting memory exists that this caller cannot see'
                using errcode = '23505';
        end if;
    elsif p_embedding is not null then
        -- its vectors (insert_embedding): of the content, and of the context line
        -- followed by the content; in the graph as insert_embedding decides (at once
        -- on a distributed database, where graph_min_vectors() is 0)
        execute format('execute harbor_save_vectors_%s(%L, %L, %L, %L, %L, %L, %L, %L, %L, %L)',
                       p_key, v_row.tenant_id, v_row.id, coalesce(p_model_id, ''), v_row.scope,
                       v_row.project_id, v_row.user_id, v_row.session_id, v_row.run_id,
                       p_embedding, p_context_embedding);
    end if;
    -- the row as the insert returned it (or the duplicate as read): no read-back
    return query
    select v_row.id, v_row.tenant_id, v_row.scope::text, v_row.project_id,
           v_row.principal_id, v_row.user_id, v_row.session_id, v_row.run_id,
           v_row.memory_type::text, v_row.content, v_row.content_hash, v_row.importance,
           v_row.entity_ids, v_row.source, v_row.sensitivity::text,
           pg_catalog.lower(v_row.valid), pg_catalog.upper(v_row.valid), v_row.superseded_by,
           v_row.source_session_id, v_row.source_message_ids, v_row.metadata, v_row.context,
           v_row.created_at, v_row.updated_at, v_row.expires_at, v_created;
end
$$;
alter function harbor._save_memory_on_shard(text, text, text, harbor.memory_scope, text, text,
    text, text, text, harbor.memory_type, real, text, text, text, text[], text,
    harbor.sensitivity, text, text[], jsonb, timestamptz, timestamptz, text, public.vector,
    public.vector)
    owner to harbor_owner;
revoke all on function harbor._save_memory_on_shard(text, text, text, harbor.memory_scope,
    text, text, text, text, text, harbor.memory_type, real, text, text, text, text[], text,
    harbor.sensitivity, text, text[], jsonb, timestamptz, timestamptz, text, public.vector,
    public.vector)
    from public, harbor_search;
grant execute on function harbor._save_memory_on_shard(text, text, text, harbor.memory_scope,
    text, text, text, text, text, harbor.memory_type, real, text, text, text, text[], text,
    harbor.sensitivity, text, text[], jsonb, timestamptz, timestamptz, text, public.vector,
    public.vector)
    to harbor_app, harbor_admin;

create or replace function harbor.save_memory_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_id text, p_scope harbor.memory_scope, p_key_project_id text, p_key_user_id text,
    p_key_session_id text, p_key_run_id text, p_writer_id text,
    p_memory_type harbor.memory_type, p_importance real, p_content text,
    p_content_hash text, p_context text, p_entity_ids text[], p_source text,
    p_sensitivity harbor.sensitivity, p_source_session_id text,
    p_source_message_ids text[], p_metadata jsonb, p_valid_from timestamptz,
    p_expires_at timestamptz,
    p_model_id text default null, p_embedding public.vector default null,
    p_context_embedding public.vector default null)
    returns table (
        id text, tenant_id text, scope text, project_id text, principal_id text,
        user_id text, session_id text, run_id text, memory_type text, content text,
        content_hash text, importance real, entity_ids text[], source text,
        sensitivity text, valid_from timestamptz, invalid_at timestamptz,
        superseded_by text, source_session_id text, source_message_ids text[],
        metadata jsonb, context text, created_at timestamptz, updated_at timestamptz,
        expires_at timestamptz, created boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.save_memory_delegated', 'harbor.memories', p_tenant_id, p_project_id, p_principal_id,
        p_user_id, p_session_id, p_run_id);
    -- the insert and the vectors through the statements above
    return query
    select * from harbor._save_memory_on_shard(
        harbor._save_statements(p_tenant_id), p_tenant_id, p_id, p_scope, p_key_project_id,
        p_key_user_id, p_key_session_id, p_key_run_id, p_writer_id, p_memory_type,
        p_importance, p_content, p_content_hash, p_context, p_entity_ids, p_source,
        p_sensitivity, p_source_session_id, p_source_message_ids, p_metadata, p_valid_from,
        p_expires_at, p_model_id, p_embedding, p_context_embedding);
end
$$;
alter function harbor.save_memory_delegated(text, text, text, text, text, text, text, harbor.memory_scope, text, text, text, text,
    text, harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text,
    text[], jsonb, timestamptz, timestamptz, text, public.vector, public.vector)
    owner to harbor_owner;
revoke all on function harbor.save_memory_delegated(text, text, text, text, text, text, text, harbor.memory_scope, text, text, text, text,
    text, harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text,
    text[], jsonb, timestamptz, timestamptz, text, public.vector, public.vector)
    from public, harbor_admin, harbor_search;
grant execute on function harbor.save_memory_delegated(text, text, text, text, text, text, text, harbor.memory_scope, text, text, text, text,
    text, harbor.memory_type, real, text, text, text, text[], text, harbor.sensitivity, text,
    text[], jsonb, timestamptz, timestamptz, text, public.vector, public.vector)
    to harbor_app;

-- A batch's save (save_many) on a distributed database, in one call that Citus delegates
-- whole to the tenant's worker, as save_memory_delegated's (above): the identity checked
-- first, then each memory saved by the same steps, in the order given (the facade sorts a
-- batch by dedup key, so two batches of the same facts wait for each other instead of
-- deadlocking), in the call's one transaction: all or nothing, committed on the worker
-- in one phase. The statements it replaces were each memory's insert and vectors, each
-- sent from the coordinator in the batch's transaction (a hop and two plannings each).
-- Each array has one element per memory, as save_memories' (sql/queries/long_term.sql):
-- every memory of the batch is of the caller's tenant (the elevated role's TENANT memories
-- go through save_tenant_memories_delegated, below); entity_ids and source_message_ids are
-- one JSON array of strings each.
-- One row per memory, in input order.
create or replace function harbor.save_memories_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_ids text[], p_scopes harbor.memory_scope[], p_key_project_ids text[],
    p_key_user_ids text[], p_key_session_ids text[], p_key_run_ids text[],
    p_writer_ids text[], p_memory_types harbor.memory_type[], p_importances real[],
    p_contents text[], p_content_hashes text[], p_contexts text[], p_entity_ids jsonb[],
    p_sources text[], p_sensitivities harbor.sensitivity[], p_source_session_ids text[],
    p_source_message_ids jsonb[], p_metadata jsonb[], p_valid_froms timestamptz[],
    p_expires_ats timestamptz[], p_model_id text default null,
    p_embeddings public.vector[] default null, p_context_embeddings public.vector[] default null)
    returns table (
        id text, tenant_id text, scope text, project_id text, principal_id text,
        user_id text, session_id text, run_id text, memory_type text, content text,
        content_hash text, importance real, entity_ids text[], source text,
        sensitivity text, valid_from timestamptz, invalid_at timestamptz,
        superseded_by text, source_session_id text, source_message_ids text[],
        metadata jsonb, context text, created_at timestamptz, updated_at timestamptz,
        expires_at timestamptz, created boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key text;  -- the suffix of the prepared statements' names
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.save_memories_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, p_user_id, p_session_id, p_run_id);
    if coalesce(cardinality(p_contents), 0) = 0 then
        return;
    end if;
    v_key := harbor._save_statements(p_tenant_id);
    for i in 1..cardinality(p_contents) loop
        return query
        select * from harbor._save_memory_on_shard(
            v_key, p_tenant_id, p_ids[i], p_scopes[i], p_key_project_ids[i],
            p_key_user_ids[i], p_key_session_ids[i], p_key_run_ids[i], p_writer_ids[i],
            p_memory_types[i], p_importances[i], p_contents[i], p_content_hashes[i],
            p_contexts[i],
            array(select pg_catalog.jsonb_array_elements_text(p_entity_ids[i])),
            p_sources[i], p_sensitivities[i], p_source_session_ids[i],
            array(select pg_catalog.jsonb_array_elements_text(p_source_message_ids[i])),
            p_metadata[i], p_valid_froms[i], p_expires_ats[i], p_model_id, p_embeddings[i],
            p_context_embeddings[i]);
    end loop;
end
$$;
alter function harbor.save_memories_delegated(text, text, text, text, text, text, text[],
    harbor.memory_scope[], text[], text[], text[], text[], text[], harbor.memory_type[],
    real[], text[], text[], text[], jsonb[], text[], harbor.sensitivity[], text[], jsonb[],
    jsonb[], timestamptz[], timestamptz[], text, public.vector[], public.vector[])
    owner to harbor_owner;
revoke all on function harbor.save_memories_delegated(text, text, text, text, text, text,
    text[], harbor.memory_scope[], text[], text[], text[], text[], text[],
    harbor.memory_type[], real[], text[], text[], text[], jsonb[], text[],
    harbor.sensitivity[], text[], jsonb[], jsonb[], timestamptz[], timestamptz[], text,
    public.vector[], public.vector[])
    from public, harbor_admin, harbor_search;
grant execute on function harbor.save_memories_delegated(text, text, text, text, text, text,
    text[], harbor.memory_scope[], text[], text[], text[], text[], text[],
    harbor.memory_type[], real[], text[], text[], text[], jsonb[], text[],
    harbor.sensitivity[], text[], jsonb[], jsonb[], timestamptz[], timestamptz[], text,
    public.vector[], public.vector[])
    to harbor_app;

-- The elevated role's save of TENANT memories (one, or a save_many batch) on a
-- distributed database, in one call that Citus delegates whole to the tenant's worker, as
-- save_memories_delegated's (above): the same arguments, the identity set and checked the
-- same way before any row is read or written (a caller that names another tenant, the
-- distribution argument, or another user or session than its own is refused), then each
-- memory saved by the same steps in the call's one transaction, all or nothing. Granted to
-- harbor_admin alone, and for TENANT memories alone: a memory of any other scope is refused
-- before anything is read (a GLOBAL memory, tenant '', lies on another shard, and its
-- writer sets harbor.global_memory_flag in its transaction on the coordinator:
-- sql/citus/global.sql). The rows are written under harbor_admin's policies, as on one
-- server: an unbound administrator writes the TENANT memories of the tenant it names, and
-- a bound role granted harbor_admin writes none (every harbor_admin policy starts with "not
-- bound"). The application role cannot run it (and its own calls above write no TENANT
-- memory: its policies refuse the scope). One row per memory, in input order.
create or replace function harbor.save_tenant_memories_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_ids text[], p_scopes harbor.memory_scope[], p_key_project_ids text[],
    p_key_user_ids text[], p_key_session_ids text[], p_key_run_ids text[],
    p_writer_ids text[], p_memory_types harbor.memory_type[], p_importances real[],
    p_contents text[], p_content_hashes text[], p_contexts text[], p_entity_ids jsonb[],
    p_sources text[], p_sensitivities harbor.sensitivity[], p_source_session_ids text[],
    p_source_message_ids jsonb[], p_metadata jsonb[], p_valid_froms timestamptz[],
    p_expires_ats timestamptz[], p_model_id text default null,
    p_embeddings public.vector[] default null, p_context_embeddings public.vector[] default null)
    returns table (
        id text, tenant_id text, scope text, project_id text, principal_id text,
        user_id text, session_id text, run_id text, memory_type text, content text,
        content_hash text, importance real, entity_ids text[], source text,
        sensitivity text, valid_from timestamptz, invalid_at timestamptz,
        superseded_by text, source_session_id text, source_message_ids text[],
        metadata jsonb, context text, created_at timestamptz, updated_at timestamptz,
        expires_at timestamptz, created boolean)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key text;  -- the suffix of the prepared statements' names
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.save_tenant_memories_delegated', 'harbor.memories', p_tenant_id,
        p_project_id, p_principal_id, p_user_id, p_session_id, p_run_id);
    if exists (select 1 from pg_catalog.unnest(p_scopes) s(scope)
                where s.scope is distinct from 'tenant'::harbor.memory_scope) then
        raise exception 'harbor.save_tenant_memories_delegated: TENANT memories only'
            using errcode = '22023';
    end if;
    if coalesce(cardinality(p_contents), 0) = 0 then
        return;
    end if;
    v_key := harbor._save_statements(p_tenant_id);
    for i in 1..cardinality(p_contents) loop
        return query
        select * from harbor._save_memory_on_shard(
            v_key, p_tenant_id, p_ids[i], p_scopes[i], p_key_project_ids[i],
            p_key_user_ids[i], p_key_session_ids[i], p_key_run_ids[i], p_writer_ids[i],
            p_memory_types[i], p_importances[i], p_contents[i], p_content_hashes[i],
            p_contexts[i],
            array(select pg_catalog.jsonb_array_elements_text(p_entity_ids[i])),
            p_sources[i], p_sensitivities[i], p_source_session_ids[i],
            array(select pg_catalog.jsonb_array_elements_text(p_source_message_ids[i])),
            p_metadata[i], p_valid_froms[i], p_expires_ats[i], p_model_id, p_embeddings[i],
            p_context_embeddings[i]);
    end loop;
end
$$;
alter function harbor.save_tenant_memories_delegated(text, text, text, text, text, text,
    text[], harbor.memory_scope[], text[], text[], text[], text[], text[],
    harbor.memory_type[], real[], text[], text[], text[], jsonb[], text[],
    harbor.sensitivity[], text[], jsonb[], jsonb[], timestamptz[], timestamptz[], text,
    public.vector[], public.vector[])
    owner to harbor_owner;
revoke all on function harbor.save_tenant_memories_delegated(text, text, text, text, text,
    text, text[], harbor.memory_scope[], text[], text[], text[], text[], text[],
    harbor.memory_type[], real[], text[], text[], text[], jsonb[], text[],
    harbor.sensitivity[], text[], jsonb[], jsonb[], timestamptz[], timestamptz[], text,
    public.vector[], public.vector[])
    from public, harbor_app, harbor_search;
grant execute on function harbor.save_tenant_memories_delegated(text, text, text, text, text,
    text, text[], harbor.memory_scope[], text[], text[], text[], text[], text[],
    harbor.memory_type[], real[], text[], text[], text[], jsonb[], text[],
    harbor.sensitivity[], text[], jsonb[], jsonb[], timestamptz[], timestamptz[], text,
    public.vector[], public.vector[])
    to harbor_admin;
