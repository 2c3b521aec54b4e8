-- A recall's hits counted (PostgresLongTermStore.record_hits: with importance decay on,
-- after the recall returned, harbor.record_hits() as the application role) on a
-- distributed database, in one call that Citus delegates whole to the tenant's worker
-- (harbor-pg distribute registers it with create_distributed_function, distribution
-- argument p_tenant_id, co-located with harbor.memories; harbor_pg.db.citus). Sent in
-- autocommit, it is the one command the coordinator sends for it, and its own transaction
-- on the worker: no transaction block, no SET LOCAL, no commit round trip. (As a
-- coordinator transaction with SET LOCAL, one server's statement reached the worker as
-- several commands: BEGIN with the identity, the statement, COMMIT.)
--
-- The identity travels as the call's first arguments, as the other delegated calls' does:
-- harbor._delegated_caller (sql/citus/delegated.sql) sets it (SET LOCAL) and checks it
-- against what the policies read; a caller that names another tenant (the distribution
-- argument), user or session than its own is refused before any row is read. The
-- statement, one server's harbor.record_hits() (sql/functions/tiers.sql) for the caller's
-- tenant, then runs as the caller (security invoker), over the tenant's shard tables of
-- harbor.memories and harbor.memory_hits (prepared once a connection,
-- harbor._prepare_on_shard, unless harbor._prepared_on_shard finds it; on the coordinator,
-- a call in a transaction block, over the distributed tables), under the policies and the
-- owner trigger those tables carry: each memory of p_ids the caller can see gets one more
-- hit and last_recalled_at now(), rows in key order (two callers counting the same
-- memories wait for each other instead of deadlocking).
--
-- One server's function counts the GLOBAL memories (tenant '') among p_ids too; their
-- shard may be another worker's, which this call does not reach. So it returns, beside
-- how many it counted, the ids of p_ids it did not count (uncounted) when GLOBAL memories
-- may exist (harbor.global_memory_flag, read on this node: sql/citus/global.sql), for the
-- caller to count in the coordinator's transaction (harbor.record_hits(), which reaches
-- the '' shard); with the flag unset no GLOBAL memory exists, and uncounted is empty. (A
-- recall without the global scope returns only the tenant's memories: one call.)
create or replace function harbor.record_hits_delegated(
    p_tenant_id text, p_project_id text, p_principal_id text, p_user_id text,
    p_session_id text, p_run_id text, p_ids text[]
) returns table (counted bigint, uncounted text[])
    language plpgsql volatile security invoker
    set search_path to pg_catalog, pg_temp
as $$
declare
    v_key     text := 'tables';
    v_name    text;    -- the prepared statement's name
    v_counted text[] := '{}';  -- the ids counted
    v_id      text;
begin
    -- the identity set and checked, the shard held (sql/citus/delegated.sql)
    perform harbor._delegated_caller(
        'harbor.record_hits_delegated', 'harbor.memories', p_tenant_id, p_project_id,
        p_principal_id, coalesce(nullif(p_user_id, ''), p_principal_id, ''), p_session_id,
        p_run_id);
    -- one server's statement, on the tenant's shard tables (sql/citus/delegated.sql); two
    -- tables, so prepared here rather than through harbor._statement_on_shard (one table)
    if (select g.groupid from pg_dist_local_group g) <> 0 then
        v_key := get_shard_id_for_distribution_column('harbor.memories'::regclass,
                                                      p_tenant_id)::text;
    end if;
    v_name := 'harbor_hits_' || v_key;
    if not harbor._prepared_on_shard(v_name) then
        perform harbor._prepare_on_shard(array[v_name], array[pg_catalog.format($q$
            prepare %s(text, text[]) as
            insert into %s as h (tenant_id, memory_id, scope, project_id, user_id,
                                 session_id, run_id, hits, last_recalled_at)
            select m.tenant_id, m.id, m.scope, m.project_id, m.user_id, m.session_id,
                   m.run_id, 1, pg_catalog.now()
              from %s m
             where m.tenant_id = $1
               and m.id = any ($2)
             order by m.id
            on conflict (tenant_id, memory_id) do update
               set hits = h.hits + 1,
                   last_recalled_at = greatest(h.last_recalled_at, excluded.last_recalled_at)
            returning h.memory_id $q$,
            v_name, harbor._tenant_table('harbor.memory_hits', p_tenant_id),
            harbor._tenant_table('harbor.memories', p_tenant_id))]);
    end if;
    for v_id in execute pg_catalog.format('execute %s(%L, %L)', v_name, p_tenant_id, p_ids)
    loop
        v_counted := v_counted || v_id;
    end loop;
    counted := pg_catalog.cardinality(v_counted);
    uncounted := '{}';
    if harbor._global_memories_may_exist() then
        uncounted := array(select distinct r from unnest(p_ids) r
                            where r is not null and r <> all (v_counted));
    end if;
    return next;
end
$$;
alter function harbor.record_hits_delegated(text, text, text, text, text, text, text[])
    owner to harbor_owner;
revoke all on function harbor.record_hits_delegated(text, text, text, text, text, text, text[])
    from public, harbor_admin;
grant execute on function harbor.record_hits_delegated(text, text, text, text, text, text,
                                                       text[])
    to harbor_app;
