-- The caller's memories past their expiry closed (PostgresLongTermStore.expire_memories:
-- harbor.expire_memories() as the application role) on a distributed database, in one
-- call that Citus delegates whole to the tenant's worker (harbor-pg distribute registers
-- it with create_distributed_function, distribution argument p_tenant_id, co-located with
-- harbor.memories; harbor_pg.db.citus). Sent in autocommit, it is the one command the
-- coordinator sends for it, and its own transaction on the worker: no transaction block,
-- no SET LOCAL, no commit round trip.
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement, one server's harbor.expire_memories() (sql/functions/maintenance.sql) for the
-- caller's tenant, then runs as the caller (security invoker), over the tenant's shard
-- table (prepared once a connection, harbor._prepare_on_shard, unless
-- harbor._prepared_on_shard finds it; on the coordinator, a call in a transaction block,
-- over the distributed table), under the policies that table carries: the application
-- role closes the expired memories of its own owner keys, no one else's, each at its
-- expiry. (The application role writes no GLOBAL memory, so the tenant's shard holds all
-- it may close; the periodic upkeep of every tenant stays the elevated role's
-- harbor.expire_memories() on the coordinator.) (A writing CTE counts the rows: on the
-- shard table it is PostgreSQL's statement alone.) Returns how many it closed.
create or replace function harbor.expire_memories_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text
) returns bigint
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_name   text;    -- the prepared statement's name
    v_closed bigint;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.expire_memories_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    -- one server's statement, on the tenant's shard table (sql/citus/delegated.sql)
    v_name := harbor._statement_on_shard(
        'harbor_expire_', 'harbor.memories', p_tenant_id, $q$
        prepare %s(text) as
        with c as (update %s m
                      set valid = case when m.expires_at > lower(m.valid)
                                       then tstzrange(lower(m.valid), m.expires_at, '[)')
                                       else tstzrange(lower(m.valid), lower(m.valid), '[]') end
                    where m.tenant_id = $1
                      and m.expires_at is not null and m.expires_at <= pg_catalog.now()
                      and upper_inf(m.valid)
                   returning 1)
        select pg_catalog.count(*) from c $q$);
    execute pg_catalog.format('execute %s(%L)', v_name, p_tenant_id) into v_closed;
    return v_closed;
end
$$;
alter function harbor.expire_memories_delegated(text, text, text, text, text, text)
    owner to harbor_owner;
revoke all on function harbor.expire_memories_delegated(text, text, text, text, text, text)
    from public, harbor_admin;
grant execute on function harbor.expire_memories_delegated(text, text, text, text, text, text)
    to harbor_app;
