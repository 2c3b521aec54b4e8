-- A session's rolling summary on a distributed database, read in one call that Citus
-- delegates whole to the tenant's worker (harbor-pg distribute registers it with
-- create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus): what the per-turn context reads beside the recent
-- turns (sql/citus/recent.sql) and recall. Sent in autocommit, it is the one command the
-- coordinator sends for it: no transaction block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.memories, which its shard tables carry. The row is context_load_summary's
-- (sql/queries/context.sql): the newest currently valid SESSION/SUMMARY memory of the
-- caller's session.
create or replace function harbor.session_summary_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text
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
        'harbor.session_summary_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_summary_', 'harbor.memories', p_tenant_id, $q$
        prepare %s(text, text, text) as
        select m.id, m.tenant_id, m.scope::text, m.project_id, m.principal_id, m.user_id,
               m.session_id, m.run_id, m.memory_type::text, m.content, m.content_hash,
               m.importance, m.entity_ids, m.source, m.sensitivity::text, lower(m.valid),
               upper(m.valid), m.superseded_by, m.source_session_id, m.source_message_ids,
               m.metadata, m.context, m.created_at, m.updated_at, m.expires_at
          from %s m
         where m.tenant_id = $1 and m.scope = 'session'
           and m.user_id = $2 and m.session_id = $3
           and m.memory_type = 'summary' and upper_inf(m.valid)
         order by m.updated_at desc, m.id
         limit 1 $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L)', v_name, p_tenant_id,
                                           v_user, p_session_id);
end
$$;
alter function harbor.session_summary_delegated(text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.session_summary_delegated(text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.session_summary_delegated(text, text, text, text, text, text)
    to harbor_app;
