-- Memories read by id on a distributed database (MemoryManager.get, and the store's
-- get_many), the caller's tenant's, in one call that Citus delegates whole to the tenant's
-- worker (harbor-pg distribute registers it with create_distributed_function, distribution
-- argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in
-- autocommit, it is the one command the coordinator sends for it: no transaction block, no
-- SET LOCAL, no commit round trip. The global memories (tenant '', on their own shard,
-- maybe another node's) are read apart, by get_global_memories (sql/queries/citus.sql),
-- which any caller may read, and only when they may exist: a flag this function reads on
-- the worker (harbor.global_memory_flag, sql/citus/global.sql), as a delegated search does
-- (sql/citus/search.sql). When it is set, the answer ends with one more row, every column
-- of which is null (the id too), which stands for the global memories and tells the
-- facade (harbor_pg.tiers.long_term) to read them (for a get, only when the tenant's
-- shard has none of the id); unset, a read by id is this one command to one worker.
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
    set plan_cache_mode to force_generic_plan
as $$
declare
    v_user  text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.get_memories_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_get_', 'harbor.memories', p_tenant_id, $q$
        prepare %s(text, text[]) as
        select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
               upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
               m.metadata, m.context, m.created_at, m.updated_at, m.expires_at
          from %s m
         where m.tenant_id = $1 and m.id = any ($2) $q$);
    return query execute pg_catalog.format('execute %s(%L, %L)', v_name, p_tenant_id, p_ids);
    -- the global memories' marker (above), from this node's copy of the flag
    if harbor._global_memories_may_exist() then
        return next;  -- (the marker: no output column was assigned, all are null)
    end if;
end
$$;
alter function harbor.get_memories_delegated(text, text, text, text, text, text, text[])
    owner to harbor_owner;
revoke all on function harbor.get_memories_delegated(text, text, text, text, text, text, text[])
    from public, harbor_admin;
grant execute on function harbor.get_memories_delegated(text, text, text, text, text, text,
                                                        text[])
    to harbor_app;
