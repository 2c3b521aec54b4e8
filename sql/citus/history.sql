-- A memory's history (MemoryManager.history: its supersession chain, oldest first) on a
-- distributed database, the caller's tenant's chain, in one call that Citus delegates whole
-- to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it: no transaction block, no SET LOCAL, no commit round trip. The
-- global memories' chain (tenant '', on their own shard) is read apart, by memory_history
-- for tenant '' alone (sql/queries/history.sql), only when the tenant's shard has none.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.memories, which its shard tables carry: memory_history's, for the caller's
-- tenant alone, over the tenant's shard table (a chain never leaves its tenant), where its
-- recursive CTEs are PostgreSQL's alone.
create or replace function harbor.memory_history_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_id text
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
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.memory_history_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_history_', 'harbor.memories', p_tenant_id, $q$
        prepare %1$s(text, text) as
        with recursive back (id, depth) as (
            select m.id, 0
              from %2$s m
             where m.tenant_id = $1 and m.id = $2
            union
            select p.id, b.depth - 1
              from back b
              join %2$s p on p.tenant_id = $1 and p.superseded_by = b.id
             where b.depth > -1000
        ), ahead (id, next_id, depth) as (
            select m.id, m.superseded_by, 0
              from %2$s m
             where m.tenant_id = $1 and m.id = $2
            union
            select n.id, n.superseded_by, a.depth + 1
              from ahead a
              join %2$s n on n.tenant_id = $1 and n.id = a.next_id
             where a.depth < 1000
        ), chain (id, depth) as (
            select id, depth from back
            union
            select id, depth from ahead
        )
        select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
               upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
               m.metadata, m.context, m.created_at, m.updated_at, m.expires_at
          from (select id, min(depth) as depth from chain group by id) c
          join %2$s m on m.tenant_id = $1 and m.id = c.id
         order by c.depth, lower(m.valid), m.id $q$);
    return query execute pg_catalog.format('execute %s(%L, %L)', v_name, p_tenant_id, p_id);
end
$$;
alter function harbor.memory_history_delegated(text, text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.memory_history_delegated(text, text, text, text, text, text,
                                                       text)
    from public, harbor_admin;
grant execute on function harbor.memory_history_delegated(text, text, text, text, text, text,
                                                          text)
    to harbor_app;
