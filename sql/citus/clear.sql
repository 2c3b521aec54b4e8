-- A session's turns (MemoryManager.clear) and a run's working state
-- (MemoryManager.clear_working) deleted on a distributed database, each in one call that
-- Citus delegates whole to the tenant's worker (harbor-pg distribute registers them with
-- create_distributed_function, distribution argument p_tenant_id, co-located with the
-- table they delete from; harbor_pg.db.citus). Sent in autocommit, each is the one command
-- the coordinator sends for it, and its own transaction on the worker: no transaction
-- block, no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement then runs as the caller (security invoker), over the tenant's shard table
-- (prepared once a connection, harbor._prepare_on_shard, unless harbor._prepared_on_shard
-- finds it; on the coordinator, a call in a transaction block, over the distributed
-- table), under the policies that table carries. (A writing CTE counts the rows: on the
-- shard table it is PostgreSQL's statement alone.) Each returns how many rows it deleted,
-- as clear_messages (sql/queries/short_term.sql) and clear_working
-- (sql/queries/working.sql) do.

create or replace function harbor.clear_session_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text
) returns bigint
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user    text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_name    text;    -- the prepared statement's name
    v_deleted bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.clear_session_delegated', 'harbor.messages', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_name := harbor._statement_on_shard(
        'harbor_clear_session_', 'harbor.messages', p_tenant_id, $q$
        prepare %s(text, text, text) as
        with d as (delete from %s x
                    where x.tenant_id = $1 and x.user_id = $2 and x.session_id = $3
                   returning 1)
        select pg_catalog.count(*) from d $q$);
    execute pg_catalog.format('execute %s(%L, %L, %L)', v_name, p_tenant_id, v_user,
                              p_session_id)
        into v_deleted;
    return v_deleted;
end
$$;
alter function harbor.clear_session_delegated(text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.clear_session_delegated(text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.clear_session_delegated(text, text, text, text, text, text)
    to harbor_app;

create or replace function harbor.clear_working_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text
) returns bigint
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_user    text := coalesce(nullif(p_user_id, ''), p_principal_id, '');
    v_name    text;    -- the prepared statement's name
    v_deleted bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.clear_working_delegated', 'harbor.working_state', p_tenant_id, p_project_id,
        p_principal_id, v_user, p_session_id, p_run_id);
    v_name := harbor._statement_on_shard(
        'harbor_clear_working_', 'harbor.working_state', p_tenant_id, $q$
        prepare %s(text, text, text, text, text) as
        with d as (delete from %s x
                    where x.tenant_id = $1 and x.user_id = $2 and x.session_id = $3
                      and x.run_id = $4 and x.project_id = $5
                   returning 1)
        select pg_catalog.count(*) from d $q$);
    execute pg_catalog.format('execute %s(%L, %L, %L, %L, %L)', v_name, p_tenant_id, v_user,
                              p_session_id, coalesce(p_run_id, ''), coalesce(p_project_id, ''))
        into v_deleted;
    return v_deleted;
end
$$;
alter function harbor.clear_working_delegated(text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.clear_working_delegated(text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.clear_working_delegated(text, text, text, text, text, text)
    to harbor_app;
