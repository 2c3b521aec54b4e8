-- Memories read by id on a distributed database (MemoryManager.get, and the store's
-- get_many), the caller's tenant's, in one call that Citus delegates whole to the tenant's
-- worker (harbor-pg distribute registers it with create_distributed_function, distribution
-- argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in
-- autocommit, it is the one command the coordinator sends for it: no transaction block, no
-- SET LOCAL, no commit round trip. The global memories (tenant '', on their own shard,
-- maybe another node's) are read apart, by get_global_memories (sql/queries/citus.sql),
-- which any caller may read: for a get, only when the tenant's shard has none of the id.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.memories, which its shard tables carry. The rows are get_memories' of the
-- caller's tenant (sql/queries/long_term.sql): the memories of these ids the caller may
-- see, whatever their validity.
create or replace function harbor.get_memories_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_ids text[]
) returns table (
    id text, tenant_id text, scope text, project_id text, principal_id text, user_id text,
    session_id text, run_id text, memory_type text, content text, content_hash text,
    importance real, entity_ids text[], source text, sensitivity text,
    valid_from timestamptz, invalid_at timestamptz, superseded_by text,
    source_session_id text, source_message_ids text[], metadata jsonb, context text,
    created_at timestamptz, updated_at timestamptz, expires_at timestamptz
)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user  text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_shard bigint;  -- the tenant's shard of harbor.memories
    v_name  text;    -- the prepared statement's name
    v_table text;    -- the table it reads
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.get_memories_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- on the worker that holds the tenant's shard, one server's statement over the shard
    -- table, which carries the distributed table's policies, prepared once a connection
    -- (harbor._prepare_on_shard, unless harbor._prepared_on_shard finds them) and run by
    -- name; on the coordinator (a call in a transaction block, not delegated) over the
    -- distributed table, which Citus routes to the tenant's shard
    if (select g.groupid from pg_dist_local_group g) = 0 then
        v_table := 'harbor.memories';
        v_name := 'harbor_get_tables';
    else
        v_shard := get_shard_id_for_distribution_column('harbor.memories'::regclass,
                                                        p_tenant_id);
        v_table := shard_name('harbor.memories'::regclass, v_shard);
        v_name := 'harbor_get_' || v_shard;
    end if;
    if not harbor._prepared_on_shard(v_name) then
        perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format($q$
            prepare %s(text, text[]) as
            select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
                   m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
                   m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
                   upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
                   m.metadata, m.context, m.created_at, m.updated_at, m.expires_at
              from %s m
             where m.tenant_id = $1 and m.id = any ($2) $q$, v_name, v_table)]);
    end if;
    return query execute pg_catalog.format('execute %s(%L, %L)', v_name, p_tenant_id, p_ids);
end
$$;
alter function harbor.get_memories_delegated(text, text, text, text, text, text, text[])
    owner to harbor_owner;
revoke all on function harbor.get_memories_delegated(text, text, text, text, text, text, text[])
    from public, harbor_admin;
grant execute on function harbor.get_memories_delegated(text, text, text, text, text, text,
                                                        text[])
    to harbor_app;
