-- The caller's currently valid memories (MemoryManager.current_memories) on a distributed
-- database, in one call that Citus delegates whole to the tenant's worker (harbor-pg
-- distribute registers it with create_distributed_function, distribution argument
-- p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in autocommit,
-- it is the one command the coordinator sends for it: no transaction block, no SET LOCAL,
-- no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.memories, which its shard tables carry. The rows are
-- extraction_current_memories' (sql/queries/extraction.sql), its parameters after the
-- identity: a scope whose key parameters are null is off.
create or replace function harbor.current_memories_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_user_user_id text, p_session_user_id text, p_session_session_id text,
    p_project_project_id text, p_limit integer
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
        'harbor.current_memories_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_current_', 'harbor.memories', p_tenant_id, $q$
        prepare %1$s(text, text, text, text, text, integer) as
        select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
               upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
               m.metadata, m.context, m.created_at, m.updated_at, m.expires_at
          from (select * from %2$s u
                 where u.tenant_id = $1 and u.scope = 'user'
                   and u.user_id = $2 and u.project_id = ''
                   and u.session_id = '' and u.run_id = ''
                union all
                select * from %2$s s
                 where s.tenant_id = $1 and s.scope = 'session'
                   and s.user_id = $3 and s.project_id = ''
                   and s.session_id = $4 and s.run_id = ''
                union all
                select * from %2$s p
                 where p.tenant_id = $1 and p.scope = 'project'
                   and p.project_id = $5 and p.user_id = ''
                   and p.session_id = '' and p.run_id = '') m
         where m.memory_type <> 'summary'
           and upper_inf(m.valid) and lower(m.valid) <= pg_catalog.now()
           and not coalesce(m.expires_at <= pg_catalog.now(), false)
         order by lower(m.valid) desc, m.id
         limit $6 $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, p_user_user_id, p_session_user_id,
                                           p_session_session_id, p_project_project_id,
                                           p_limit);
end
$$;
alter function harbor.current_memories_delegated(text, text, text, text, text, text, text, text,
                                                 text, text, integer)
    owner to harbor_owner;
revoke all on function harbor.current_memories_delegated(text, text, text, text, text, text,
                                                         text, text, text, text, integer)
    from public, harbor_admin;
grant execute on function harbor.current_memories_delegated(text, text, text, text, text, text,
                                                            text, text, text, text, integer)
    to harbor_app;
