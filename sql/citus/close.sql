-- A current memory's interval ended now with no successor (PostgresLongTermStore.close_memory:
-- MemoryManager.observe closes an observation whose facts fell away) on a distributed
-- database, in one call that Citus delegates whole to the tenant's worker (harbor-pg
-- distribute registers it with create_distributed_function, distribution argument
-- p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in autocommit, it
-- is the one command the coordinator sends for it, and its own transaction on the worker:
-- no transaction block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement, one server's close_memory (sql/queries/extraction.sql) for the scope and owner
-- key given, then runs as the caller (security invoker), over the tenant's shard table
-- (prepared once a connection, harbor._prepare_on_shard, unless harbor._prepared_on_shard
-- finds it; on the coordinator, a call in a transaction block, over the distributed
-- table), under the policies that table carries. Returns the memory's id when it closed it.
create or replace function harbor.close_memory_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text,
    p_scope harbor.memory_scope, p_key_project_id text, p_key_user_id text,
    p_key_session_id text, p_key_run_id text, p_id text
) returns table (id text)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.close_memory_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    v_name := harbor._statement_on_shard(
        'harbor_close_', 'harbor.memories', p_tenant_id, $q$
        prepare %s(text, text, harbor.memory_scope, text, text, text, text) as
        update %s m
           set valid = tstzrange(lower(m.valid), pg_catalog.now(), '[)')
         where m.tenant_id = $1 and m.id = $2
           and m.scope = $3 and m.project_id = $4
           and m.user_id = $5 and m.session_id = $6
           and m.run_id = $7
           and m.memory_type <> 'summary'
           and m.superseded_by is null
           and upper_inf(m.valid) and lower(m.valid) < pg_catalog.now()
        returning m.id $q$);
    return query execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L, %L, %L)', v_name,
                                           p_tenant_id, p_id, p_scope, p_key_project_id,
                                           p_key_user_id, p_key_session_id, p_key_run_id);
end
$$;
alter function harbor.close_memory_delegated(text, text, text, text, text, text,
                                             harbor.memory_scope, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.close_memory_delegated(text, text, text, text, text, text,
                                                     harbor.memory_scope, text, text, text,
                                                     text, text)
    from public, harbor_admin;
grant execute on function harbor.close_memory_delegated(text, text, text, text, text, text,
                                                        harbor.memory_scope, text, text, text,
                                                        text, text)
    to harbor_app;
