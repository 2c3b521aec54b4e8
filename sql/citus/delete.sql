-- One of the caller's own memories deleted (MemoryManager.delete) on a distributed
-- database, in one call that Citus delegates whole to the tenant's worker (harbor-pg
-- distribute registers it with create_distributed_function, distribution argument
-- p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in autocommit,
-- it is the one command the coordinator sends for it, and its own transaction on the
-- worker: no transaction block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), under the policies of
-- harbor.memories, which its shard tables carry with their triggers and keys (the
-- memory's vectors and hits go with it; the versions it superseded are unlinked,
-- sql/citus/successor.sql). The row is delete_memory's (sql/queries/long_term.sql): the
-- id deleted, none when the caller may not delete it.
create or replace function harbor.delete_memory_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_id text
) returns table (id text)
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_name  text;    -- the prepared statement's name
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.delete_memory_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_delete_', 'harbor.memories', p_tenant_id, $q$
        prepare %s(text, text) as
        delete from %s m
         where m.tenant_id = $1 and m.id = $2
        returning m.id $q$);
    return query execute pg_catalog.format('execute %s(%L, %L)', v_name, p_tenant_id, p_id);
end
$$;
alter function harbor.delete_memory_delegated(text, text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.delete_memory_delegated(text, text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.delete_memory_delegated(text, text, text, text, text, text,
                                                         text)
    to harbor_app;
